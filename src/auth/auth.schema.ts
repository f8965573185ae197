import { Type } from 'typebox';
import { Nullable } from '../platform/http/schemas.js';

export const IdentifierType = Type.Union([Type.Literal('PHONE'), Type.Literal('EMAIL')]);
export const Scene = Type.Union([
  Type.Literal('REGISTER'),
  Type.Literal('LOGIN'),
  Type.Literal('RESET_PASSWORD'),
]);
const Identifier = Type.String({ minLength: 1, maxLength: 320 });
const Code = Type.String({ minLength: 1, maxLength: 16 });
const Password = Type.String({ minLength: 1, maxLength: 128 });
/**
 * A password being set: any string, so that every one outside the policy (8 to 128 characters with
 * a letter and a digit), empty or long ones too, gets its own answer, `PASSWORD_POLICY_VIOLATION`.
 */
const NewPassword = Type.String({
  description: '8 to 128 characters, with at least one letter and one digit (else PASSWORD_POLICY_VIOLATION)',
});
const Token = Type.String({ minLength: 1, maxLength: 4096 });

export const SendCodeBody = Type.Object({
  scene: Scene,
  identifierType: IdentifierType,
  identifier: Identifier,
});
export const SendCodeResponse = Type.Object({
  identifier: Type.String(),
  scene: Scene,
  expireSeconds: Type.Integer(),
});

export const RegisterBody = Type.Object({
  identifierType: IdentifierType,
  identifier: Identifier,
  code: Code,
  password: Type.Optional(NewPassword),
  // Must be true; left out or false, the answer is TERMS_NOT_ACCEPTED rather than a schema error.
  agreeTerms: Type.Optional(Type.Boolean({ description: 'Must be true: the terms are accepted' })),
});

/** Password or code: exactly one of the two is required. */
export const LoginBody = Type.Object({
  identifierType: IdentifierType,
  identifier: Identifier,
  password: Type.Optional(Password),
  code: Type.Optional(Code),
});

export const RefreshBody = Type.Object({ refreshToken: Token });

export const ResetPasswordBody = Type.Object({
  identifierType: IdentifierType,
  identifier: Identifier,
  code: Code,
  newPassword: NewPassword,
});

export const TokenResponse = Type.Object({
  accessToken: Type.String(),
  accessTokenExpiresAt: Type.String({ format: 'date-time' }),
  refreshToken: Type.String(),
  refreshTokenExpiresAt: Type.String({ format: 'date-time' }),
});

export const AuthUserResponse = Type.Object({
  id: Type.Integer(),
  nickname: Type.String(),
  avatar: Type.String(),
  phone: Nullable(Type.String()),
  email: Nullable(Type.String()),
  zhId: Type.String(),
  birthday: Nullable(Type.String()),
  school: Nullable(Type.String()),
  bio: Nullable(Type.String()),
  gender: Type.String(),
  tagJson: Type.String(),
});

export const AuthResponse = Type.Object({ user: AuthUserResponse, token: TokenResponse });
