import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { Authenticator } from './authenticator.js';
import { signingKeyFromPem } from './keys.js';
import { SessionStore } from './sessions.js';
import { TokenSigner } from './tokens.js';

/** A map-backed store: enough for session semantics, and countable. */
class MapKv implements KeyValueStore {
  readonly data = new Map<string, string>();
  calls = 0;
  async get(k: string) {
    this.calls++;
    return this.data.get(k) ?? null;
  }
  async mget(ks: readonly string[]) {
    this.calls++;
    return ks.map((k) => this.data.get(k) ?? null);
  }
  async set(k: string, v: string) {
    this.calls++;
    this.data.set(k, v);
  }
  async setIfAbsent(k: string, v: string) {
    this.calls++;
    if (this.data.has(k)) return false;
    this.data.set(k, v);
    return true;
  }
  async getDel(k: string) {
    this.calls++;
    const v = this.data.get(k) ?? null;
    this.data.delete(k);
    return v;
  }
  async delete(k: string) {
    this.calls++;
    return this.data.delete(k);
  }
  async incr(k: string, by = 1) {
    this.calls++;
    const n = Number(this.data.get(k) ?? 0) + by;
    this.data.set(k, String(n));
    return n;
  }
  async ttl(k: string) {
    return this.data.has(k) ? -1 : null;
  }
  async expire(k: string) {
    this.calls++;
    return this.data.has(k);
  }
  async expireIfEquals(k: string, v: string) {
    return this.data.get(k) === v;
  }
  async deleteIfEquals(k: string, v: string) {
    return this.data.get(k) === v && this.data.delete(k);
  }
}

async function setup(sessionCheckMs = 1000) {
  const pem = generateKeyPairSync('rsa', { modulusLength: 2048 })
    .privateKey.export({ type: 'pkcs8', format: 'pem' })
    .toString();
  let now = 1_800_000_000_000;
  const clock = () => now;
  const signer = new TokenSigner(
    await signingKeyFromPem(pem),
    'zg',
    { access: 900, refresh: 604_800 },
    clock,
  );
  const kv = new MapKv();
  const sessions = new SessionStore(kv, 604_800_000);
  const sut = new Authenticator(signer, sessions, sessionCheckMs, 100, clock);
  const { sid, ver } = await sessions.open(7);
  const access = await signer.sign('access', 7, sid, ver);
  const refresh = await signer.sign('refresh', 7, sid, ver);
  return {
    sut,
    signer,
    sessions,
    kv,
    sid,
    access: access.token,
    refresh: refresh.token,
    advance: (ms: number) => (now += ms),
  };
}

describe(Authenticator.name, () => {
  it('accepts a live access token and refuses a refresh token', async () => {
    const { sut, access, refresh } = await setup();
    expect(await sut.authenticate(access)).toEqual({ userId: 7, sid: expect.any(String) });
    await expect(sut.authenticate(refresh)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('verifies a token once and asks the session store at most once per check interval', async () => {
    const { sut, signer, kv, access } = await setup(1000);
    const verify = vi.spyOn(signer, 'verify');
    const before = kv.calls;
    for (let i = 0; i < 50; i++) await sut.authenticate(access);
    expect(verify).toHaveBeenCalledTimes(1);
    expect(kv.calls - before).toBe(1);
  });

  it('honours a revocation made elsewhere once the check interval has passed', async () => {
    const { sut, sessions, sid, access, advance } = await setup(1000);
    await sut.authenticate(access);
    await sessions.end(sid);
    advance(1001);
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('asks the session store again once the clock stepped back', async () => {
    const { sut, sessions, sid, access, advance } = await setup(1000);
    await sut.authenticate(access);
    await sessions.end(sid);
    advance(-60_000);
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('honours a revocation made in this process at once', async () => {
    const { sut, sessions, sid, access } = await setup(60_000);
    await sut.authenticate(access);
    await sessions.end(sid);
    sut.forgetSession(sid);
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('does not keep a check that was in flight while this process ended the session', async () => {
    const { sut, sessions, sid, access } = await setup(60_000);
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let read!: () => void;
    const hasRead = new Promise<void>((resolve) => (read = resolve));
    const isActive = sessions.isActive.bind(sessions);
    vi.spyOn(sessions, 'isActive').mockImplementationOnce(async (...args) => {
      const answer = await isActive(...args);
      read();
      await gate;
      return answer;
    });
    const inFlight = sut.authenticate(access);
    await hasRead; // "active", not answered yet
    await sessions.end(sid);
    sut.forgetSession(sid);
    release();
    await inFlight;
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('refuses an expired token even when it is cached', async () => {
    const { sut, access, advance } = await setup(0);
    await sut.authenticate(access);
    advance(901_000);
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('ends every session of a user when the session version moves', async () => {
    const { sut, sessions, access } = await setup(0);
    await sut.authenticate(access);
    await sessions.endAll(7);
    await expect(sut.authenticate(access)).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
  });

  it('keeps its caches bounded', async () => {
    const { sut, signer, sessions } = await setup(1000);
    for (let i = 0; i < 150; i++) {
      const { sid, ver } = await sessions.open(100 + i);
      await sut.authenticate((await signer.sign('access', 100 + i, sid, ver)).token);
    }
    const internals = sut as unknown as {
      verified: Map<string, unknown>;
      sessionChecks: Map<string, unknown>;
    };
    expect(internals.verified.size).toBeLessThanOrEqual(100);
    expect(internals.sessionChecks.size).toBeLessThanOrEqual(100);
  });
});

describe(SessionStore.name, () => {
  it('rotates a refresh token for exactly one of many concurrent callers', async () => {
    const { sessions, signer, sid } = await setup();
    const { jti } = await signer.sign('refresh', 7, sid, 0);
    await sessions.allowRefresh(sid, jti);
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, () => sessions.takeRefresh(sid, jti, 7, 0)),
    );
    expect(outcomes.filter((o) => o === 'ok')).toHaveLength(1);
  });

  it('ends the family when a rotated token comes back', async () => {
    const { sessions, signer, sid } = await setup();
    const { jti } = await signer.sign('refresh', 7, sid, 0);
    await sessions.allowRefresh(sid, jti);
    expect(await sessions.takeRefresh(sid, jti, 7, 0)).toBe('ok');
    expect(await sessions.takeRefresh(sid, jti, 7, 0)).toBe('reused');
    expect(await sessions.isActive(sid, 7, 0)).toBe(false);
  });
});
