import type { UserRow } from './users.repository.js';

/** `AuthUserResponse` of the contract: the signed-in user's own view of themselves. */
export function toAuthUser(user: UserRow) {
  return {
    id: user.id,
    nickname: user.nickname,
    avatar: user.avatar,
    phone: user.phone,
    email: user.email,
    zhId: user.zg_id,
    birthday: user.birthday,
    school: user.school,
    bio: user.bio,
    gender: user.gender,
    tagJson: user.tags_json,
  };
}

/**
 * `ProfileResponse`; phone and e-mail only when `own` (the caller's own profile). Anyone else's is
 * the public profile, which leaves both keys out, as the relation lists do.
 */
export function toProfile(user: UserRow, own: boolean) {
  const profile = {
    id: user.id,
    nickname: user.nickname,
    avatar: user.avatar,
    bio: user.bio,
    zgId: user.zg_id,
    gender: user.gender,
    birthday: user.birthday,
    school: user.school,
    tagJson: user.tags_json,
  };
  return own ? { ...profile, phone: user.phone, email: user.email } : profile;
}
