import { isIPv4, isIPv6 } from 'node:net';

/**
 * The part of a client address that names one client for rate limits: an IPv4 address whole, an
 * IPv6 address by its /64 network, which a single subscriber is commonly handed whole (limiting each
 * of its addresses apart would give that client 2^64 allowances). IPv4-mapped IPv6 addresses count
 * as the IPv4 address they carry.
 */
export function rateLimitSubject(ip: string): string {
  const address = ip.replace(/%.*$/, '');
  if (isIPv4(address)) return address;
  if (!isIPv6(address)) return address;
  const groups = expandIPv6(address);
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) {
    return `${groups[6]! >> 8}.${groups[6]! & 0xff}.${groups[7]! >> 8}.${groups[7]! & 0xff}`;
  }
  return `${groups
    .slice(0, 4)
    .map((g) => g.toString(16))
    .join(':')}::/64`;
}

/**
 * The network an IPv6 client's /64 lies in, commonly handed to one subscriber whole (a /48; a /56
 * at least): its many /64s share a higher allowance (see `NETWORK_ALLOWANCE`). Null for IPv4
 * clients (an IPv4-mapped address included) and for what is not an address.
 */
export function rateLimitNetwork(ip: string): string | null {
  const address = ip.replace(/%.*$/, '');
  if (!isIPv6(address)) return null;
  const groups = expandIPv6(address);
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) return null;
  return `${groups
    .slice(0, 3)
    .map((g) => g.toString(16))
    .join(':')}::/48`;
}

/**
 * How many clients' allowances an IPv6 /48 gets together: enough for the many subscribers a mobile
 * or cloud provider may put in one, far below the 65,536 /64s one holder of a /48 could rotate through.
 */
export const NETWORK_ALLOWANCE = 16;

/** The eight 16-bit groups of a valid IPv6 address (with `::` and a dotted IPv4 tail resolved). */
function expandIPv6(address: string): number[] {
  const [head = '', tail] = address.split('::');
  const parse = (part: string): number[] =>
    part === ''
      ? []
      : part.split(':').flatMap((group) => {
          if (!group.includes('.')) return [parseInt(group, 16)];
          const [a = 0, b = 0, c = 0, d = 0] = group.split('.').map(Number);
          return [(a << 8) | b, (c << 8) | d];
        });
  const first = parse(head);
  if (tail === undefined) return first;
  const last = parse(tail);
  return [...first, ...new Array<number>(8 - first.length - last.length).fill(0), ...last];
}
