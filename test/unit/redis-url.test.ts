import { describe, expect, it } from 'vitest';
import { redisTarget } from '../../src/cli/redis-target.js';
import { parseRedisUrl, RedisUrlError, redisUrlHasPassword } from '../../src/contract/redis-url.js';
import { parseSiteConfig } from '../../src/contract/site-config.js';

const SSH = { LoginHost: 'login.example.org', User: 'hpc', KeyFile: '/k', KnownHostsFile: '/kh' };

describe('Redis URLs: one server or a Sentinel set', () => {
  it('reads one server, with a user, a password and a database', () => {
    expect(parseRedisUrl('redis://127.0.0.1:6380/3', {}).options).toEqual({ host: '127.0.0.1', port: 6380, db: 3 });
    expect(parseRedisUrl('redis://fleet:s%40cret@redis.example.org', {}).options).toEqual({
      host: 'redis.example.org',
      port: 6379,
      username: 'fleet',
      password: 's@cret',
    });
    expect(parseRedisUrl('rediss://:pw@[::1]:6390', {}).options).toMatchObject({
      host: '::1',
      port: 6390,
      password: 'pw',
    });
    // SNI is for names: an address gets none (Node warns otherwise), a name gets itself.
    expect(parseRedisUrl('rediss://:pw@[::1]:6390', {}).options.tls).toEqual({});
    expect(parseRedisUrl('rediss://redis.example.org', {}).options.tls).toEqual({ servername: 'redis.example.org' });
  });

  it('reads sentinels (26379 by default), the master name and a database; follows failovers as they are announced', () => {
    const parsed = parseRedisUrl('redis+sentinel://10.0.0.1,10.0.0.2:26380,[::1]/mymaster/2', {});
    expect(parsed.sentinel).toBe(true);
    expect(parsed.options).toEqual({
      sentinels: [
        { host: '10.0.0.1', port: 26379 },
        { host: '10.0.0.2', port: 26380 },
        { host: '::1', port: 26379 },
      ],
      name: 'mymaster',
      db: 2,
      failoverDetector: true,
      sentinelCommandTimeout: 2_000,
    });
    expect(parsed.where).toBe('10.0.0.1:26379,10.0.0.2:26380,::1:26379 (master mymaster)');
  });

  it("gives the master the URL's credentials and the sentinels only REDIS_SENTINEL_PASSWORD; TLS for both with rediss+sentinel", () => {
    const url = 'rediss+sentinel://fleet:pw@s1:26379,s2:26379/m';
    expect(parseRedisUrl(url, {}).options).toMatchObject({
      username: 'fleet',
      password: 'pw',
      enableTLSForSentinelMode: true,
    });
    expect(parseRedisUrl(url, {}).options.sentinelPassword).toBeUndefined();
    expect(parseRedisUrl(url, { REDIS_SENTINEL_PASSWORD: 'spw' }).options.sentinelPassword).toBe('spw');
    expect(redisUrlHasPassword(url)).toBe(true);
    expect(redisUrlHasPassword('redis+sentinel://s1/m')).toBe(false);
  });

  it.each([
    ['http://127.0.0.1:6379', /not a Redis URL; accepted: redis:\/\//],
    ['redis://127.0.0.1:99999', /port 99999 is not 1-65535/],
    ['redis://127.0.0.1/x', /database "x" is not a number/],
    ['redis://127.0.0.1/1/2', /only a database number may follow the host/],
    ['redis+sentinel:///mymaster', /no sentinel/],
    ['redis+sentinel://s1:26379', /the master's name must follow the sentinels/],
    ['redis+sentinel://s1:26379,bad host/m', /sentinel: "bad host" is not host\[:port\]/],
    ['redis://h?tls=true', /query parameters are not read/],
  ])('refuses %s, saying why', (url, message) => {
    expect(() => parseRedisUrl(url, {})).toThrow(RedisUrlError);
    expect(() => parseRedisUrl(url, {})).toThrow(message);
  });

  it('the site configuration takes a Sentinel URL and refuses a bad one naming the key and what is accepted', () => {
    const ok = parseSiteConfig({
      Network: { SSH },
      Backhaul: { Redis: { URL: 'redis+sentinel://s1,s2,s3/backhaul' } },
    });
    expect(ok.Backhaul.Redis.URL).toBe('redis+sentinel://s1,s2,s3/backhaul');
    expect(() => parseSiteConfig({ Network: { SSH }, Backhaul: { Redis: { URL: 'redis+sentinel://s1' } } })).toThrow(
      /Backhaul\.Redis\.URL.*master's name must follow the sentinels/,
    );
  });

  it('a command refuses a bad --redis or REDIS_URL with usage, naming which', () => {
    expect(() => redisTarget({ redis: 'redis+sentinel://s1' }, undefined, {})).toThrow(
      /^--redis: the master's name must follow the sentinels/,
    );
    expect(() => redisTarget({}, undefined, { REDIS_URL: 'http://x' })).toThrow(/^REDIS_URL: not a Redis URL/);
    expect(redisTarget({}, undefined, { REDIS_URL: 'redis+sentinel://s1,s2/bh' }).url).toBe(
      'redis+sentinel://s1,s2/bh',
    );
  });
});
