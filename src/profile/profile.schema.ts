import { Type } from 'typebox';
import { MultiLine, Nullable, SingleLine } from '../platform/http/schemas.js';

/** Most characters of the profile's text fields (their columns' sizes), also once in NFC. */
export const MAX_CHARACTERS = { nickname: 64, bio: 512, school: 128 } as const;

export const Gender = Type.Union([
  Type.Literal('MALE'),
  Type.Literal('FEMALE'),
  Type.Literal('OTHER'),
  Type.Literal('UNKNOWN'),
]);

export const ProfilePatchBody = Type.Object({
  nickname: Type.Optional(SingleLine({ minLength: 1, maxLength: MAX_CHARACTERS.nickname })),
  bio: Type.Optional(MultiLine({ maxLength: MAX_CHARACTERS.bio })),
  gender: Type.Optional(Gender),
  birthday: Type.Optional(
    Type.String({
      pattern: '^(?:\\d{4}-\\d{2}-\\d{2})?$',
      description:
        'yyyy-MM-dd, from 1900 on and not later than today in the time zone furthest ahead (UTC+14); ' +
        'an empty string takes the birthday off the profile',
    }),
  ),
  zgId: Type.Optional(Type.String({ pattern: '^[a-zA-Z0-9_]{4,32}$' })),
  school: Type.Optional(
    SingleLine({
      maxLength: MAX_CHARACTERS.school,
      description: 'an empty string takes the school off the profile',
    }),
  ),
  tagJson: Type.Optional(Type.String({ maxLength: 2048 })),
});

export const ProfileResponse = Type.Object({
  id: Type.Integer(),
  nickname: Type.String(),
  avatar: Type.String(),
  bio: Nullable(Type.String()),
  zgId: Type.String(),
  gender: Type.String(),
  birthday: Nullable(Type.String()),
  school: Nullable(Type.String()),
  /** Only in the caller's own profile (null when not set); left out of everyone else's. */
  phone: Type.Optional(Nullable(Type.String())),
  email: Type.Optional(Nullable(Type.String())),
  tagJson: Type.String(),
});

export const UserIdParams = Type.Object({
  userId: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
});
