import { createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { calculateJwkThumbprint, exportJWK, type JWK } from 'jose';

/** The RS256 signing key and what the JWKS publishes of it. */
export interface SigningKey {
  kid: string;
  privateKey: KeyObject;
  publicKey: KeyObject;
  publicJwk: JWK;
}

export async function signingKeyFromPem(pem: string, kid?: string): Promise<SigningKey> {
  const privateKey = createPrivateKey(pem);
  if (privateKey.asymmetricKeyType !== 'rsa') throw new Error('the JWT signing key must be an RSA key');
  const publicKey = createPublicKey(privateKey);
  const jwk = await exportJWK(publicKey);
  const keyId = kid ?? (await calculateJwkThumbprint(jwk));
  return { kid: keyId, privateKey, publicKey, publicJwk: { ...jwk, kid: keyId, alg: 'RS256', use: 'sig' } };
}

/** A key whose tokens are accepted but never signed with (the next key before a rotation, the previous one after). */
export interface VerificationKey {
  kid: string;
  publicKey: KeyObject;
  publicJwk: JWK;
}

/** From a public key's PEM, or a private key's (only its public half is kept). */
export async function verificationKeyFromPem(pem: string): Promise<VerificationKey> {
  const publicKey = createPublicKey(pem);
  if (publicKey.asymmetricKeyType !== 'rsa') throw new Error('a JWT key must be an RSA key');
  const jwk = await exportJWK(publicKey);
  const kid = await calculateJwkThumbprint(jwk);
  return { kid, publicKey, publicJwk: { ...jwk, kid, alg: 'RS256', use: 'sig' } };
}

/** Reads the key at `path`, creating it (mode 0600) on first start. */
export function loadOrCreatePem(path: string): string {
  if (existsSync(path)) return readFileSync(path, 'utf8');
  mkdirSync(dirname(path), { recursive: true });
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const pem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  writeFileSync(path, pem, { mode: 0o600, flag: 'wx' });
  return pem;
}
