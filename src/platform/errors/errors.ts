/**
 * Domain errors: a stable `code`, the HTTP status it maps to and a message safe to show a client.
 * Services and workers throw these; only the HTTP error handler turns them into responses.
 */
export class AppError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
    readonly details?: Record<string, unknown>,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'AppError';
  }
}

export class BadRequestError extends AppError {
  constructor(message: string, code = 'BAD_REQUEST', details?: Record<string, unknown>) {
    super(code, message, 400, details);
  }
}

export class UnauthorizedError extends AppError {
  constructor(message = 'Authentication required', code = 'UNAUTHORIZED') {
    super(code, message, 401);
  }
}

export class ForbiddenError extends AppError {
  constructor(message = 'Not allowed', code = 'FORBIDDEN') {
    super(code, message, 403);
  }
}

export class NotFoundError extends AppError {
  constructor(message = 'Not found', code = 'NOT_FOUND') {
    super(code, message, 404);
  }
}

export class ConflictError extends AppError {
  constructor(message: string, code = 'CONFLICT') {
    super(code, message, 409);
  }
}

export class PayloadTooLargeError extends AppError {
  constructor(message = 'Payload too large') {
    super('PAYLOAD_TOO_LARGE', message, 413);
  }
}

export class RateLimitedError extends AppError {
  constructor(
    message = 'Too many requests',
    readonly retryAfterSeconds?: number,
    code = 'RATE_LIMITED',
  ) {
    super(code, message, 429);
  }
}

export class UnavailableError extends AppError {
  /** How long a client should wait before trying again (`Retry-After`); null when trying again will not help. */
  readonly retryAfterSeconds: number | null;

  constructor(
    message = 'Service temporarily unavailable',
    options?: ErrorOptions & { retryAfterSeconds?: number | null },
  ) {
    super('UNAVAILABLE', message, 503, undefined, options);
    this.retryAfterSeconds = options?.retryAfterSeconds === undefined ? 1 : options.retryAfterSeconds;
  }
}

/** A unique key was violated; adapters translate each dialect's driver error into this. */
export class UniqueViolationError extends Error {
  constructor(
    readonly constraint: string | undefined,
    options?: { cause?: unknown },
  ) {
    super(`unique constraint violated${constraint ? `: ${constraint}` : ''}`, options);
    this.name = 'UniqueViolationError';
  }
}
