import { parseAllDocuments } from 'yaml';
import { z } from 'zod';
import { InputError } from './input-error.js';

/** What backhaul needs of a pod; everything else in the manifest is ignored. */
export interface PodRef {
  /** Kubernetes assigns it at creation: absent in a manifest that has not been applied yet. */
  uid: string | undefined;
  namespace: string;
  name: string;
  nodeName: string | undefined;
  annotations: Record<string, string>;
}

const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
/** Pod UIDs are UUIDs; the UID becomes the Slurm job name and reaches squeue's command line. */
export const POD_UID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const podSchema = z.looseObject({
  apiVersion: z.literal('v1').optional(),
  kind: z.literal('Pod', { message: 'expected kind: Pod' }).optional(),
  metadata: z.looseObject({
    name: z.string().regex(DNS_SUBDOMAIN, 'expected a DNS-1123 subdomain (lower case letters, digits, "-" and ".")'),
    namespace: z.string().regex(DNS_LABEL, 'expected a DNS-1123 label').default('default'),
    uid: z.string().regex(POD_UID, 'expected a UUID').optional(),
    annotations: z.record(z.string(), z.string({ message: 'annotation values must be strings' })).default({}),
  }),
  spec: z.looseObject({ nodeName: z.string().optional() }).optional(),
});

export function parsePod(data: unknown, source = 'pod'): PodRef {
  const result = podSchema.safeParse(data);
  if (!result.success) {
    const issue = result.error.issues[0];
    const path = issue && issue.path.length > 0 ? issue.path.map(String).join('.') : source;
    throw new InputError(path, issue?.message ?? 'invalid pod');
  }
  const { metadata, spec } = result.data;
  return {
    uid: metadata.uid,
    namespace: metadata.namespace,
    name: metadata.name,
    nodeName: spec?.nodeName,
    annotations: metadata.annotations,
  };
}

/** A pod manifest file: exactly one YAML (or JSON) document holding a Pod. */
export function parsePodYaml(text: string, source = 'pod'): PodRef {
  const docs = yamlDocuments(text, source);
  if (!Array.isArray(docs) || docs.length !== 1) {
    throw new InputError(source, 'expected exactly one YAML document holding a Pod');
  }
  const [doc] = docs;
  if (!doc || doc.errors.length > 0) {
    throw new InputError(source, `not valid YAML: ${doc?.errors[0]?.message ?? 'empty'}`);
  }
  let data: unknown;
  try {
    // maxAliasCount: a "billion laughs" document expands aliases exponentially; a pod has no need of many.
    data = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    throw new InputError(source, `not a usable YAML document: ${yamlFailure(err)}`);
  }
  return parsePod(data, source);
}

function yamlDocuments(text: string, source: string): ReturnType<typeof parseAllDocuments> {
  try {
    return parseAllDocuments(text, { uniqueKeys: true });
  } catch (err) {
    throw new InputError(source, `not valid YAML: ${yamlFailure(err)}`);
  }
}

/** Why the yaml library gave up, said for a person (deep nesting overflows its recursion). */
function yamlFailure(err: unknown): string {
  if (err instanceof RangeError) return 'nested too deeply';
  const message = err instanceof Error ? err.message : String(err);
  return message.split('\n')[0]?.slice(0, 200) ?? 'unknown';
}
