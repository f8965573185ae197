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

/** `ProfileResponse`; phone and e-mail only when `own` (the caller's own profile). */
export function toProfile(user: UserRow, own: boolean) {
  return {
    id: user.id,
    nickname: user.nickname,
    avatar: user.avatar,
    bio: user.bio,
    zgId: user.zg_id,
    gender: user.gender,
    birthday: user.birthday,
    school: user.school,
    phone: own ? user.phone : null,
    email: own ? user.email : null,
    tagJson: user.tags_json,
  };
}
