import type { UserRow } from '../profile/users.repository.js';

/**
 * A profile as anyone may see it in someone's list: the `ProfileResponse` fields without phone and
 * e-mail. Lists are shared (cached, shown to every caller), so they never carry private fields, not
 * even the caller's own.
 */
export interface PublicProfile {
  id: number;
  nickname: string;
  avatar: string;
  bio: string | null;
  zgId: string;
  gender: string;
  birthday: string | null;
  school: string | null;
  tagJson: string;
}

export function toPublicProfile(user: UserRow): PublicProfile {
  return {
    id: Number(user.id),
    nickname: user.nickname,
    avatar: user.avatar,
    bio: user.bio,
    zgId: user.zg_id,
    gender: user.gender,
    birthday: user.birthday,
    school: user.school,
    tagJson: user.tags_json,
  };
}
