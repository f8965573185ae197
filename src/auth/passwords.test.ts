import { describe, expect, it, vi } from 'vitest';
import { PasswordHasher, meetsPasswordPolicy } from './passwords.js';

describe(PasswordHasher.name, () => {
  const sut = new PasswordHasher(10);

  it('verifies the right password and refuses a wrong one', async () => {
    const stored = await sut.hash('correct horse 1');
    expect(stored).toMatch(/^scrypt\$10\$8\$1\$/);
    expect(stored).not.toContain('correct horse');
    expect(await sut.verify('correct horse 1', stored)).toBe(true);
    expect(await sut.verify('correct horse 2', stored)).toBe(false);
  });

  it('salts every hash and keeps old hashes valid after the cost is raised', async () => {
    const a = await sut.hash('same-pass-1');
    const b = await sut.hash('same-pass-1');
    expect(a).not.toBe(b);
    expect(await new PasswordHasher(11).verify('same-pass-1', a)).toBe(true);
  });

  it("answers a hash made at an earlier cost no sooner than a check at today's cost", async () => {
    const waits: number[] = [];
    const raised = new PasswordHasher(13, async (ms) => waits.push(ms));
    const burn = vi.spyOn(raised, 'burn');
    const earlier = await new PasswordHasher(8).hash('dormant-pass-1');
    // Nothing measured yet at today's cost: a burn makes up the time (and measures it).
    expect(await raised.verify('wrong-pass-1', earlier)).toBe(false);
    expect(burn).toHaveBeenCalledTimes(1);
    // Then the rest of the measured time is waited out; the cheap check takes a fraction of it.
    expect(await raised.verify('dormant-pass-1', earlier)).toBe(true);
    expect(burn).toHaveBeenCalledTimes(1);
    expect(waits).toHaveLength(1);
    // A hash at today's cost needs neither.
    expect(await raised.verify('dormant-pass-1', await raised.hash('dormant-pass-1'))).toBe(true);
    expect(burn).toHaveBeenCalledTimes(1);
    expect(waits).toHaveLength(1);
  });

  it('refuses malformed stored hashes', async () => {
    expect(await sut.verify('x', 'plain')).toBe(false);
    expect(await sut.verify('x', 'bcrypt$1$2$3$4$5')).toBe(false);
  });
});

describe(meetsPasswordPolicy.name, () => {
  it.each([
    ['abc12345', true],
    ['密码密码密码12', true],
    ['abcdefgh', false],
    ['12345678', false],
    ['ab1', false],
    // Characters, not UTF-16 units: five characters in eight units, then eight in sixteen.
    ['😀😀😀a1', false],
    ['😀😀😀😀😀😀a1', true],
    [`a1${'😀'.repeat(126)}`, true],
    [`a1${'😀'.repeat(127)}`, false],
    // A lone surrogate would be hashed as U+FFFD: "\ud800abc12345" and "\udfffabc12345" would match.
    ['\ud800abc12345', false],
    ['abc12345\udfff', false],
  ])('%s → %s', (password, ok) => expect(meetsPasswordPolicy(password)).toBe(ok));
});
