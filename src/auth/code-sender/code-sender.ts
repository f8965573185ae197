/**
 * Delivers a verification code to a person. `send` resolves once the message was handed to the
 * delivery channel (mail server accepted it, or the line was logged) and rejects otherwise; the
 * caller then withdraws the code, so a person is never told a code went out when it did not.
 */
export type IdentifierType = 'PHONE' | 'EMAIL';
export type Scene = 'REGISTER' | 'LOGIN' | 'RESET_PASSWORD';

export interface CodeMessage {
  identifierType: IdentifierType;
  identifier: string;
  scene: Scene;
  code: string;
  expireSeconds: number;
}

/**
 * Whole minutes a code has left, never rounded up (a code sent again keeps its lifetime, so it may
 * have 90 s left: "1 minute", not "2"); at least 1.
 */
export function minutesLeft(expireSeconds: number): number {
  return Math.max(1, Math.floor(expireSeconds / 60));
}

/**
 * The channel works but refuses this one recipient (a mailbox the mail server rejects, a number the
 * SMS gateway turns down). Unlike a failing channel, anyone can cause this at will with an address
 * of their choosing, so it says nothing about the channel's health.
 */
export class RecipientRefusedError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'RecipientRefusedError';
  }
}

export interface CodeSender {
  send(message: CodeMessage): Promise<void>;
  /** Whether codes for this identifier type can be sent at all (a setting, not a passing failure). */
  delivers?(type: IdentifierType): boolean;
  close?(): Promise<void>;
}

/**
 * Routes each identifier type to its own sender (mail for email, SMS for phone); a type without
 * one is not delivered to.
 */
export class RoutingCodeSender implements CodeSender {
  constructor(private readonly byType: Record<IdentifierType, CodeSender | null>) {}

  delivers(type: IdentifierType): boolean {
    return this.byType[type] !== null;
  }

  send(message: CodeMessage): Promise<void> {
    const sender = this.byType[message.identifierType];
    if (sender === null) return Promise.reject(new Error(`no sender for ${message.identifierType} codes`));
    return sender.send(message);
  }

  async close(): Promise<void> {
    const unique = new Set(Object.values(this.byType));
    await Promise.all([...unique].map(async (s) => s?.close?.()));
  }
}
