import { describe, expect, it } from 'vitest';
import { InputError } from '../../src/contract/input-error.js';
import { parsePodYaml } from '../../src/contract/pod.js';

describe('pod manifests', () => {
  it('reads name, namespace, uid, node and annotations', () => {
    const pod = parsePodYaml(`apiVersion: v1
kind: Pod
metadata:
  name: analysis
  namespace: user
  uid: 7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab
  annotations:
    interlink.eu/reverse-forwards: "minio:9000"
spec:
  nodeName: interlink-slurm
  containers: [{ name: main, image: busybox }]
`);
    expect(pod).toEqual({
      uid: '7c1b0f1e-3c4f-4a5e-9d2b-0123456789ab',
      namespace: 'user',
      name: 'analysis',
      nodeName: 'interlink-slurm',
      annotations: { 'interlink.eu/reverse-forwards': 'minio:9000' },
    });
  });

  it('defaults the namespace and allows a pod not yet applied (no uid)', () => {
    expect(parsePodYaml('metadata: { name: p }')).toMatchObject({
      namespace: 'default',
      uid: undefined,
      annotations: {},
    });
  });

  it.each([
    ['metadata: { name: "Bad_Name" }', 'metadata.name'],
    ['metadata: { name: p, uid: "$(id)" }', 'metadata.uid'],
    ['metadata: { name: p, annotations: { a: 1 } }', 'metadata.annotations.a'],
    ['kind: Service\nmetadata: { name: p }', 'kind'],
    ['spec: {}', 'metadata'],
  ])('refuses %j naming %s', (yaml, field) => {
    expect(() => parsePodYaml(yaml)).toThrow(InputError);
    try {
      parsePodYaml(yaml);
    } catch (err) {
      expect((err as InputError).field).toBe(field);
    }
  });

  it('refuses several documents and broken YAML', () => {
    expect(() => parsePodYaml('metadata: {name: a}\n---\nmetadata: {name: b}\n')).toThrow(/exactly one YAML document/);
    expect(() => parsePodYaml('metadata: [')).toThrow(/not valid YAML/);
  });

  it('refuses an alias bomb and deep nesting with an InputError, not an exception of the YAML library', () => {
    // "Billion laughs": each level doubles the last; expanded it would be 2^30 strings.
    const levels = Array.from({ length: 30 }, (_, i) => `l${i + 1}: &l${i + 1} [*l${i}, *l${i}]`);
    const bomb = `l0: &l0 "lol"\n${levels.join('\n')}\nmetadata: {name: p}\n`;
    expect(() => parsePodYaml(bomb, 'bomb.yaml')).toThrow(InputError);
    expect(() => parsePodYaml(bomb, 'bomb.yaml')).toThrow(/^bomb\.yaml: not a usable YAML document: .*alias/i);
    const deep = `metadata: {name: p}\nx: ${'['.repeat(100_000)}${']'.repeat(100_000)}\n`;
    expect(() => parsePodYaml(deep, 'deep.yaml')).toThrow(InputError);
    expect(() => parsePodYaml(deep, 'deep.yaml')).toThrow(/^deep\.yaml: .*(nested too deeply|not valid YAML)/);
  });
});
