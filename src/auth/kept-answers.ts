import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';

/**
 * Seals the answer of a refresh-token rotation for the key-value store, so that it can be given
 * again to a caller who presents the same refresh token from the same client within the grace: the
 * key comes from a secret of the deployment, the token, the client's address and its user agent,
 * none of which the store holds. A reader of the store learns nothing from it (not even with the
 * spent token, lacking the secret), and a token presented from elsewhere opens nothing.
 */
export function sealAnswer(answer: string, secret: Uint8Array, token: string, client: AnswerClient): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', answerKey(secret, token, client), iv);
  const sealed = Buffer.concat([cipher.update(answer, 'utf8'), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), sealed]).toString('base64url');
}

/** The answer `sealAnswer` sealed with the same token and client, or null. */
export function openAnswer(
  sealed: string,
  secret: Uint8Array,
  token: string,
  client: AnswerClient,
): string | null {
  const bytes = Buffer.from(sealed, 'base64url');
  if (bytes.length < 28) return null;
  try {
    const decipher = createDecipheriv('aes-256-gcm', answerKey(secret, token, client), bytes.subarray(0, 12));
    decipher.setAuthTag(bytes.subarray(12, 28));
    return Buffer.concat([decipher.update(bytes.subarray(28)), decipher.final()]).toString('utf8');
  } catch {
    return null;
  }
}

export interface AnswerClient {
  ip: string | null;
  userAgent: string | null;
}

function answerKey(secret: Uint8Array, token: string, client: AnswerClient): Buffer {
  const hash = createHmac('sha256', secret).update('zhiguang refresh answer v1');
  // Each part with its length, so that no two different triples hash alike.
  for (const part of [token, client.ip ?? '', client.userAgent ?? '']) {
    const bytes = Buffer.from(part, 'utf8');
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    hash.update(length).update(bytes);
  }
  return hash.digest();
}
