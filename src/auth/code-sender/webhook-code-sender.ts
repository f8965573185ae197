import { minutesLeft, RecipientRefusedError, type CodeMessage, type CodeSender } from './code-sender.js';

const PURPOSES: Record<CodeMessage['scene'], string> = {
  REGISTER: '注册',
  LOGIN: '登录',
  RESET_PASSWORD: '重置密码',
};

export interface WebhookCodeSenderOptions {
  url: string;
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string | undefined;
  timeoutMs?: number;
}

/**
 * Hands a code to an SMS gateway, or a relay to one, with one JSON POST:
 * `{to, identifierType, scene, code, expireSeconds, text}`. A 2xx answer means the gateway took it;
 * anything else (another status, a network error, no answer within the timeout) rejects, and the
 * caller withdraws the code: 400 and 422 as a refused message, the rest as a failing gateway. Redirects are not followed.
 */
export class WebhookCodeSender implements CodeSender {
  private readonly timeoutMs: number;

  constructor(private readonly options: WebhookCodeSenderOptions) {
    this.timeoutMs = options.timeoutMs ?? 10_000;
  }

  async send(message: CodeMessage): Promise<void> {
    const minutes = minutesLeft(message.expireSeconds);
    const response = await fetch(this.options.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(this.options.token ? { authorization: `Bearer ${this.options.token}` } : {}),
      },
      body: JSON.stringify({
        to: message.identifier,
        identifierType: message.identifierType,
        scene: message.scene,
        code: message.code,
        expireSeconds: message.expireSeconds,
        text: `【知光】您的${PURPOSES[message.scene]}验证码是 ${message.code}，${minutes} 分钟内有效。`,
      }),
      redirect: 'manual',
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    // The answer's body is of no use; read it so the connection can be reused.
    await response.arrayBuffer().catch(() => undefined);
    if (response.status >= 200 && response.status <= 299) return;
    // 400 and 422 refuse this message (its number, say); any other status is the channel's trouble
    // (401 and 403 a wrong token, 404 a wrong URL, 429 and 5xx the gateway itself).
    if (response.status === 400 || response.status === 422)
      throw new RecipientRefusedError(`the SMS webhook refused the message (${response.status})`);
    throw new Error(`the SMS webhook answered ${response.status}`);
  }
}
