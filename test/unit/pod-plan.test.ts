import { describe, expect, it } from 'vitest';
import { ANNOTATION } from '../../src/contract/annotations.js';
import { InputError } from '../../src/contract/input-error.js';
import type { SiteConfig } from '../../src/contract/site-config.js';
import { startPod } from '../../src/machines/pod-machine.js';
import { podLimits } from '../../src/pods/fleet-deps.js';
import { launchPlan, parseStoredPlan, renderPlan, siteDigest } from '../../src/workers/pod-plan.js';
import { siteWith } from './contract-fixtures.js';

/** A site whose pods need no verdict of the watch role (the plan is the subject here). */
function controlOnlySite(): SiteConfig {
  const site = siteWith();
  site.Backhaul.Kubernetes.NamespaceLabel = '';
  site.Backhaul.Kubernetes.NetworkPolicies = false;
  return site;
}
const site = controlOnlySite();
/** The same site with another login node: a fleet restarted with a changed site file. */
const moved = controlOnlySite();
moved.Network.SSH.LoginHost = 'login2.example.org';

function context(annotations: Record<string, string> = { [ANNOTATION.forwards]: 'redis:6379' }) {
  const input = { uid: '0f5e2c1a-0000-4000-8000-00000000a11c', namespace: 'user', name: 'trainer', annotations };
  return startPod({ ...input, ...podLimits(site) }, 1).snapshot.context;
}

describe('the session plan, rendered once', () => {
  it('names the site configuration it was rendered from', () => {
    const rendered = renderPlan(context(), site);
    expect(rendered.site).toBe(siteDigest(site));
    expect(rendered.site).toMatch(/^[0-9a-f]{64}$/);
    expect(siteDigest(moved)).not.toBe(siteDigest(site));
    expect(siteDigest(controlOnlySite())).toBe(siteDigest(site));
    expect(rendered.plan).toMatchObject({ uid: context().uid, carrier: { loginHost: 'login.example.org' } });
  });

  it('launch takes the stored plan as it is under the same site configuration', () => {
    const stored = renderPlan(context(), site);
    const launch = launchPlan(context(), site, stored);
    expect(launch.rendered).toBeUndefined();
    expect(launch.plan).toEqual(stored.plan);
  });

  it('renders again when the stored plan, under the same site, is not a session plan (another version, a hand edit)', () => {
    const stored = renderPlan(context(), site);
    const edited = {
      ...stored,
      plan: { ...stored.plan, carrier: { mode: 'node', loginHost: 'elsewhere.example.org' } },
    };
    const launch = launchPlan(context(), site, edited);
    expect(launch.rendered).toBe('unreadable');
    expect(launch.plan).toEqual(stored.plan);
  });

  it('renders again under another site configuration, and says why', () => {
    const launch = launchPlan(context(), moved, renderPlan(context(), site));
    expect(launch.rendered).toBe('site-changed');
    expect(launch.plan.carrier.loginHost).toBe('login2.example.org');
  });

  it('renders when nothing was stored (a record rebuilt after Redis lost its data)', () => {
    const launch = launchPlan(context(), site, null);
    expect(launch.rendered).toBe('not-stored');
    expect(launch.plan).toEqual(renderPlan(context(), site).plan);
  });

  it('reads back what the store keeps, and renders again when that is not a plan', () => {
    const stored = renderPlan(context(), site);
    expect(parseStoredPlan(JSON.stringify(stored))).toEqual(stored);
    expect(parseStoredPlan(null)).toBeNull();
    expect(parseStoredPlan('{"site":"x","plan":{}}')).toBe('unreadable');
    expect(parseStoredPlan('not json')).toBe('unreadable');
    const launch = launchPlan(context(), site, 'unreadable');
    expect(launch.rendered).toBe('unreadable');
    expect(launch.plan).toEqual(stored.plan);
  });

  it('refuses bad input while rendering, naming the annotation', () => {
    expect(() => renderPlan(context({}), site)).toThrow(InputError);
    expect(() => renderPlan(context({}), site)).toThrow(ANNOTATION.forwards);
  });
});
