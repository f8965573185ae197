import { randomBytes, scrypt as scryptCb, timingSafeEqual, type ScryptOptions } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const scrypt = promisify<string, Buffer, number, ScryptOptions, Buffer>(scryptCb);
const KEY_LENGTH = 32;

/**
 * Password hashing with scrypt (memory-hard, built into Node). The stored form carries its own
 * parameters — `scrypt$<log2N>$<r>$<p>$<salt b64>$<hash b64>` — so the cost can be raised later
 * without breaking existing hashes.
 */
export class PasswordHasher {
  /** How long a hash at today's parameters took here lately (a moving average); none measured yet. */
  private typicalMs: number | undefined;

  constructor(
    private readonly log2N: number,
    private readonly wait: (ms: number) => Promise<unknown> = sleep,
  ) {}

  async hash(password: string): Promise<string> {
    const salt = randomBytes(16);
    const r = 8; // `needsRehash` knows these two
    const p = 1;
    const hash = await this.timed(() => this.derive(password, salt, this.log2N, r, p));
    return `scrypt$${this.log2N}$${r}$${p}$${salt.toString('base64')}$${hash.toString('base64')}`;
  }

  /**
   * Whether the password matches. A hash made with other parameters (before the cost was raised)
   * is answered no sooner than one at today's cost, which an unknown account's burn takes: waiting
   * out the difference, or burning once when no time was measured yet. So a dormant account's check
   * does not tell that the account exists.
   */
  async verify(password: string, stored: string): Promise<boolean> {
    if (!this.needsRehash(stored)) return this.timed(() => this.check(password, stored));
    const started = performance.now();
    const matches = await this.check(password, stored);
    if (this.typicalMs === undefined) await this.burn(password);
    else {
      const left = this.typicalMs - (performance.now() - started);
      if (left > 0) await this.wait(left);
    }
    return matches;
  }

  private async timed<T>(work: () => Promise<T>): Promise<T> {
    const started = performance.now();
    const result = await work();
    const took = performance.now() - started;
    this.typicalMs = this.typicalMs === undefined ? took : this.typicalMs * 0.8 + took * 0.2;
    return result;
  }

  private async check(password: string, stored: string): Promise<boolean> {
    const [scheme, n, r, p, salt, hash] = stored.split('$');
    if (scheme !== 'scrypt' || !n || !r || !p || !salt || !hash) return false;
    const expected = Buffer.from(hash, 'base64');
    const actual = await this.derive(password, Buffer.from(salt, 'base64'), Number(n), Number(r), Number(p));
    return actual.length === expected.length && timingSafeEqual(actual, expected);
  }

  /** Whether a stored hash was made with other parameters than the current ones (a cost since raised). */
  needsRehash(stored: string): boolean {
    const [scheme, n, r, p] = stored.split('$');
    return scheme !== 'scrypt' || Number(n) !== this.log2N || r !== '8' || p !== '1';
  }

  /** Spends the same time as a real check, so an unknown account is not told apart by timing. */
  async burn(password: string): Promise<void> {
    await this.timed(() => this.derive(password, Buffer.alloc(16), this.log2N, 8, 1));
  }

  private derive(password: string, salt: Buffer, log2N: number, r: number, p: number): Promise<Buffer> {
    const N = 2 ** log2N;
    return scrypt(password.normalize('NFKC'), salt, KEY_LENGTH, {
      N,
      r,
      p,
      maxmem: 256 * N * r + 1024 * 1024,
    });
  }
}

/**
 * At least 8 characters (code points, as the schema counts them) with a letter and a digit, and
 * well-formed: a lone surrogate is hashed as U+FFFD, so different ones would make one password.
 */
export function meetsPasswordPolicy(password: string): boolean {
  // 128 characters are at most 256 UTF-16 units: a longer string fails without being looked at.
  if (password.length > 256 || !password.isWellFormed()) return false;
  const characters = [...password].length;
  return characters >= 8 && characters <= 128 && /\p{L}/u.test(password) && /\d/.test(password);
}
