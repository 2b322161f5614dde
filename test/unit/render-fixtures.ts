import { ANNOTATION } from '../../src/contract/annotations.js';
import type { CarrierMode } from '../../src/contract/carrier-mode.js';
import { parseReverseRequest, type ReverseRequest, requestContext } from '../../src/contract/reverse-request.js';
import type { SiteConfig } from '../../src/contract/site-config.js';
import { siteWith } from './contract-fixtures.js';

/** Public keys made once with ssh-keygen (private halves discarded): only their shape matters here. */
export const KEYS = {
  ed25519: 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJTNegu9uPGl2RtnvP/dU0P5IysJ/qhGb18SZlnkl4rH test',
  ecdsa:
    'ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBAmyR5GBFGzaaG6h3nc/Aav61tH+9JoDv+ulaQ/U3h5f+XT1Cx9SCd/pogpaTlZ/RTGrSPfMK0ZAxGd9gpTysrc= test',
  rsa: 'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCjW8wk9OflYDhJxCNibCd5nWmDApZbfhrHD3iO4MNo5s36onK7h0DsO936XrfDgNdot7aGio4Nw7q6Pdvj4lgh5I0VTnYzqUXJwXjxJNioZTt5JHUe6zhpzxgTqfF84mpMQnOuxM5EVzMQ5G7WZz8wjSopk2G8zmJZCyn7US1myglPdxohK8H5sdbzGnBIeu0FWmUikT0VUpyiNzWR5/7N0V00finc3KeB6yYaTgxoIaBZrRFY98cBFVA15Bg6jr46mUt3qQMpp7xZ7s51HNpG6cdyxWWHQq+XZqWA0KLM2zvZka2DSANc3G5xRqy2Ng6xTO2Gt9eKrnrZ6rANG8Rt test',
} as const;

export type TargetKind = 'ipv4' | 'bare' | 'fqdn';

/** Forward annotations by endpoint kind: one entry, or several. */
export const FORWARDS: Record<TargetKind, { one: string; many: string }> = {
  ipv4: { one: '10.96.0.10:5432', many: '10.96.0.10:5432 10.96.0.11:5433 6443:10.96.0.1:443' },
  bare: { one: 'redis:6379', many: 'redis:6379 minio:9000 8081:web:80' },
  fqdn: {
    one: 'minio.storage.svc.cluster.local:9000',
    many: 'minio.storage.svc.cluster.local:9000 db.example.org:5432 6443:kubernetes.default.svc.cluster.local:443',
  },
};

export function modeSettings(mode: CarrierMode): Record<string, unknown> {
  if (mode === 'srun') return { Sshd: 'userspace', NodeExec: 'srun' };
  return { Sshd: mode, NodeExec: 'ssh' };
}

/** A site and a parsed request, as the control plane would have them. */
export function requestFor(
  mode: CarrierMode,
  forwards: string,
  socksPort: number | undefined,
  reverse: Record<string, unknown> = {},
): { site: SiteConfig; request: ReverseRequest } {
  const site = siteWith({ AllowSocks: true, ...modeSettings(mode), ...reverse });
  const annotations: Record<string, string> = { [ANNOTATION.forwards]: forwards };
  if (socksPort !== undefined) annotations[ANNOTATION.socksPort] = String(socksPort);
  const request = parseReverseRequest(annotations, requestContext(site, 'user'));
  if (!request) throw new Error('no request');
  return { site, request };
}
