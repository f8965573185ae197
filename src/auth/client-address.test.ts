import { describe, expect, it } from 'vitest';
import { rateLimitNetwork, rateLimitSubject } from './client-address.js';

describe(rateLimitSubject.name, () => {
  it('names an IPv4 client by its address', () => {
    expect(rateLimitSubject('203.0.113.7')).toBe('203.0.113.7');
    expect(rateLimitSubject('::ffff:203.0.113.7')).toBe('203.0.113.7');
    expect(rateLimitSubject('::ffff:cb00:7107')).toBe('203.0.113.7');
  });

  it('names an IPv6 client by its /64, however the address is written', () => {
    const subject = '2001:db8:aa:bb::/64';
    for (const ip of [
      '2001:db8:aa:bb::1',
      '2001:0db8:00aa:00bb:ffff:ffff:ffff:fffe',
      '2001:DB8:AA:BB:1:2:3:4',
      '2001:db8:aa:bb:0:0:1.2.3.4',
      '2001:db8:aa:bb::9%eth0',
    ])
      expect({ ip, subject: rateLimitSubject(ip) }).toEqual({ ip, subject });
    expect(rateLimitSubject('2001:db8:aa:bc::1')).not.toBe(subject);
    expect(rateLimitSubject('::1')).toBe('0:0:0:0::/64');
    expect(rateLimitSubject('2001:db8::')).toBe('2001:db8:0:0::/64');
  });
});

describe(rateLimitNetwork.name, () => {
  it('names an IPv6 client’s /48, and no network for IPv4 clients', () => {
    expect(rateLimitNetwork('2001:db8:aa:bb::1')).toBe('2001:db8:aa::/48');
    expect(rateLimitNetwork('2001:0DB8:00aa:ffff:1:2:3:4%eth0')).toBe('2001:db8:aa::/48');
    expect(rateLimitNetwork('2001:db8:ab::1')).toBe('2001:db8:ab::/48');
    expect(rateLimitNetwork('203.0.113.7')).toBeNull();
    expect(rateLimitNetwork('::ffff:203.0.113.7')).toBeNull();
    expect(rateLimitNetwork('not an address')).toBeNull();
  });
});
