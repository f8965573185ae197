import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { signingKeyFromPem, verificationKeyFromPem } from './keys.js';
import { TokenSigner } from './tokens.js';

const TTL = { access: 900, refresh: 86_400 };

function newPem(): { privatePem: string; publicPem: string } {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return {
    privatePem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    publicPem: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
  };
}

describe(TokenSigner.name, () => {
  const oldKey = newPem();
  const newKey = newPem();

  it('accepts the tokens of the keys it is given besides its own, and signs with its own only', async () => {
    const before = new TokenSigner(await signingKeyFromPem(oldKey.privatePem), 'zhiguang', TTL);
    const issued = await before.sign('access', 7, 'sid-1', 1);

    // After the switch: signs with the new key, still takes the old key's tokens.
    const after = new TokenSigner(await signingKeyFromPem(newKey.privatePem), 'zhiguang', TTL, Date.now, [
      await verificationKeyFromPem(oldKey.publicPem),
    ]);
    expect(await after.verify(issued.token, 'access')).toMatchObject({ userId: 7, sid: 'sid-1', ver: 1 });
    const fresh = await after.sign('refresh', 7, 'sid-1', 1);
    // Before the switch, every process is given the next key to accept: a rolling switch signs no one out.
    const ready = new TokenSigner(await signingKeyFromPem(oldKey.privatePem), 'zhiguang', TTL, Date.now, [
      await verificationKeyFromPem(newKey.privatePem),
    ]);
    expect(await ready.verify(fresh.token, 'refresh')).toMatchObject({ userId: 7 });
    // Without it, the other key's tokens are refused, and so is a token of the wrong type.
    expect(await before.verify(fresh.token, 'refresh')).toBeNull();
    expect(await after.verify(issued.token, 'refresh')).toBeNull();
  });

  it('takes a token of either type until its expiry and refuses it after', async () => {
    let now = Date.parse('2026-12-01T00:00:00Z');
    const signer = new TokenSigner(await signingKeyFromPem(oldKey.privatePem), 'zhiguang', TTL, () => now);
    for (const typ of ['access', 'refresh'] as const) {
      const issuedAt = now;
      const issued = await signer.sign(typ, 7, 'sid-1', 1);
      expect(issued.expiresAt.getTime()).toBe(issuedAt + TTL[typ] * 1000);
      now = issuedAt + TTL[typ] * 1000 - 1_000;
      expect([typ, await signer.verify(issued.token, typ)]).toMatchObject([typ, { userId: 7 }]);
      now = issuedAt + TTL[typ] * 1000 + 1_000;
      expect([typ, await signer.verify(issued.token, typ)]).toEqual([typ, null]);
      now = issuedAt;
    }
  });

  it('tries every key when a token names none of them, and refuses a forged one', async () => {
    // Signed under a key id set by hand (ZG_JWT_KID): accepted keys are known by their thumbprints.
    const named = new TokenSigner(await signingKeyFromPem(oldKey.privatePem, '2025-key'), 'zhiguang', TTL);
    const issued = await named.sign('access', 9, 'sid-2', 3);
    const after = new TokenSigner(await signingKeyFromPem(newKey.privatePem), 'zhiguang', TTL, Date.now, [
      await verificationKeyFromPem(oldKey.publicPem),
    ]);
    expect(await after.verify(issued.token, 'access')).toMatchObject({ userId: 9 });
    // A key id kept across the rotation: the token names the id the other key now has.
    const kept = new TokenSigner(
      await signingKeyFromPem(newKey.privatePem, '2025-key'),
      'zhiguang',
      TTL,
      Date.now,
      [await verificationKeyFromPem(oldKey.publicPem)],
    );
    expect(await kept.verify(issued.token, 'access')).toMatchObject({ userId: 9 });
    const keptBefore = new TokenSigner(
      await signingKeyFromPem(oldKey.privatePem, '2025-key'),
      'zhiguang',
      TTL,
      Date.now,
      [await verificationKeyFromPem(newKey.publicPem)],
    );
    expect(await keptBefore.verify((await kept.sign('access', 9, 'sid-3', 1)).token, 'access')).toMatchObject(
      {
        userId: 9,
      },
    );

    const [header, payload, signature] = issued.token.split('.') as [string, string, string];
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString()) as Record<string, unknown>;
    const raised = Buffer.from(JSON.stringify({ ...claims, sub: '1' })).toString('base64url');
    expect(await after.verify(`${header}.${raised}.${signature}`, 'access')).toBeNull();
    expect(await after.verify('not.a.token', 'access')).toBeNull();
    expect(await after.verify('', 'access')).toBeNull();
  });
});
