import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { Static } from 'typebox';
import {
  BadRequestError,
  ConflictError,
  NotFoundError,
  PayloadTooLargeError,
  UniqueViolationError,
} from '../platform/errors/errors.js';
import { isSingleLine, isVisible } from '../platform/http/schemas.js';
import { ImageTooLargeError, withoutMetadata } from './image-metadata.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { ObjectStorage } from '../platform/storage/object-storage.js';
import { MAX_CHARACTERS, type ProfilePatchBody } from './profile.schema.js';
import type { UserPatch, UserRow, UsersRepository } from './users.repository.js';

type Patch = Static<typeof ProfilePatchBody>;

/** Each upload stores a new object, so they are counted: enough to try a few pictures, not to fill a disk. */
export const AVATAR_UPLOADS_PER_HOUR = 20;
/** Tries of an upload to set its avatar while others of the same user replace it meanwhile. */
const AVATAR_REPLACE_ATTEMPTS = 5;
/** How far ahead of UTC the furthest time zone is (Kiribati, UTC+14). */
const LATEST_ZONE_MS = 14 * 3_600_000;
/** Stored avatars other than the current one are swept once this old (younger ones may be about to be set). */
export const AVATAR_SWEEP_AGE_MS = 10 * 60_000;

/**
 * What clients send for a file whose type they do not know; `text/plain` is what a multipart part
 * without a Content-Type reads as (RFC 7578's default), the way many HTTP libraries send files.
 */
const GENERIC_TYPES = new Set(['application/octet-stream', 'binary/octet-stream', 'text/plain', '']);

const IMAGE_TYPES: { type: string; ext: string; magic: (b: Buffer) => boolean }[] = [
  {
    type: 'image/png',
    ext: '.png',
    magic: (b) => b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])),
  },
  { type: 'image/jpeg', ext: '.jpg', magic: (b) => b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff },
  { type: 'image/gif', ext: '.gif', magic: (b) => b.subarray(0, 4).toString('latin1') === 'GIF8' },
  {
    type: 'image/webp',
    ext: '.webp',
    magic: (b) =>
      b.subarray(0, 4).toString('latin1') === 'RIFF' && b.subarray(8, 12).toString('latin1') === 'WEBP',
  },
];

/** Profile edits and avatars; the rules the contract puts on each field live here and in the schema. */
export class ProfileService {
  constructor(
    private readonly users: UsersRepository,
    private readonly storage: ObjectStorage,
    private readonly avatarMaxBytes: number,
    private readonly limiter: RateLimiter,
    private readonly log?: Pick<Logger, 'warn'>,
    private readonly now: () => number = Date.now,
  ) {}

  /** Counts an avatar upload against the user's hourly allowance, before its body is read. */
  async admitAvatarUpload(userId: number): Promise<void> {
    await enforceLimit(
      this.limiter,
      `avatar:${userId}`,
      AVATAR_UPLOADS_PER_HOUR,
      3_600_000,
      'avatar uploads',
    );
  }

  async get(userId: number): Promise<UserRow> {
    const user = await this.users.findById(userId);
    if (!user) throw new NotFoundError('User not found');
    return user;
  }

  async update(userId: number, patch: Patch): Promise<UserRow> {
    const changes: UserPatch = {};
    // Text is kept in one Unicode form (NFC), so one name is not two spellings.
    if (patch.nickname !== undefined) {
      const nickname = normalized(patch.nickname, 'nickname').trim();
      if (!isVisible(nickname)) throw new BadRequestError('body.nickname must not be blank');
      changes.nickname = nickname;
    }
    if (patch.bio !== undefined) changes.bio = normalized(patch.bio, 'bio');
    if (patch.gender !== undefined) changes.gender = patch.gender;
    if (patch.school !== undefined) {
      // An empty school takes it off the profile, as for the birthday.
      const school = normalized(patch.school, 'school').trim();
      if (school !== '' && !isVisible(school))
        throw new BadRequestError('body.school must not be blank (an empty string takes it off the profile)');
      changes.school = school === '' ? null : school;
    }
    if (patch.zgId !== undefined) changes.zg_id = patch.zgId;
    // An empty birthday takes it off the profile (null leaves it as it is, as for every field).
    if (patch.birthday !== undefined)
      changes.birthday = patch.birthday === '' ? null : this.checkBirthday(patch.birthday);
    if (patch.tagJson !== undefined) changes.tags_json = checkTags(patch.tagJson);
    if (Object.keys(changes).length === 0)
      throw new BadRequestError(
        'body must set at least one profile field (nickname, bio, gender, birthday, school, zgId, ' +
          'tagJson); unknown fields are ignored and a null field is left as it is',
      );
    changes.updated_at = this.now();
    await this.get(userId);
    try {
      await this.users.update(userId, changes);
    } catch (err) {
      if (err instanceof UniqueViolationError) throw new ConflictError('This zgId is taken', 'ZGID_EXISTS');
      throw err;
    }
    return this.get(userId);
  }

  async setAvatar(userId: number, bytes: Buffer, declaredType: string): Promise<UserRow> {
    if (bytes.length > this.avatarMaxBytes) throw new PayloadTooLargeError('The avatar is too large');
    if (bytes.length === 0) throw new BadRequestError('file is empty');
    // The bytes decide the type stored and served. A declared type only has to say "an image" (a
    // browser names a PNG saved as .jpg a JPEG) or nothing in particular.
    const kind = IMAGE_TYPES.find((t) => t.magic(bytes));
    const declared = declaredType.toLowerCase();
    const agrees = declared.startsWith('image/') || GENERIC_TYPES.has(declared);
    if (!kind || !agrees) {
      throw new BadRequestError('file must be a PNG, JPEG, GIF or WebP image');
    }
    // Published to anyone: without where and when the photo was taken (see image-metadata.ts).
    const published = withoutMetadataOrRefuse(bytes, kind.type);
    if (!published)
      throw new BadRequestError(`file is not a readable ${kind.ext.slice(1).toUpperCase()} image`);
    let before = (await this.get(userId)).avatar;
    const key = `avatars/${userId}/${randomBytes(8).toString('hex')}${kind.ext}`;
    await this.storage.put(key, published, kind.type);
    const url = this.storage.publicUrl(key);
    try {
      // Another upload of the user's may land meanwhile: the avatar is replaced only as last read,
      // so every replaced object is deleted by the one request that replaced it.
      for (let attempt = 1; !(await this.users.replaceAvatar(userId, before, url, this.now())); attempt++) {
        if (attempt === AVATAR_REPLACE_ATTEMPTS)
          throw new ConflictError('The avatar kept changing; try again', 'CONFLICT');
        before = (await this.get(userId)).avatar;
      }
    } catch (err) {
      await this.storage.delete(key).catch(() => undefined);
      throw err;
    }
    await this.deleteReplaced(userId, before);
    await this.sweepAvatars(userId, key);
    return this.get(userId);
  }

  /**
   * Deletes the user's stored avatars other than `current` that are older than `AVATAR_SWEEP_AGE_MS`
   * (younger ones may be another upload's, about to be set): what a process that died between
   * storing and setting one, or a delete that failed, left behind.
   */
  private async sweepAvatars(userId: number, current: string): Promise<void> {
    try {
      const cutoff = this.now() - AVATAR_SWEEP_AGE_MS;
      const stale = (await this.storage.listPrefix(`avatars/${userId}`)).filter(
        (o) => o.key !== current && o.lastModified < cutoff,
      );
      for (const object of stale) await this.storage.delete(object.key);
    } catch (err) {
      this.log?.warn({ err, userId }, 'could not sweep old avatars');
    }
  }

  /** The avatar just replaced, when it is one this service stored for the user (not the default). */
  private async deleteReplaced(userId: number, url: string | null): Promise<void> {
    const key = url?.match(/avatars\/\d+\/[0-9a-f]{16}\.(?:png|jpg|gif|webp)$/)?.[0];
    if (key === undefined || !key.startsWith(`avatars/${userId}/`) || this.storage.publicUrl(key) !== url) {
      return;
    }
    try {
      await this.storage.delete(key);
    } catch (err) {
      // The new avatar is in place; an object left behind costs space, not correctness.
      this.log?.warn({ err, key }, 'could not delete a replaced avatar');
    }
  }

  private checkBirthday(value: string): string {
    const date = new Date(`${value}T00:00:00Z`);
    if (Number.isNaN(date.getTime()) || date.toISOString().slice(0, 10) !== value) {
      throw new BadRequestError('body.birthday is not a valid date');
    }
    // Today somewhere: the date has begun in the furthest time zone ahead of UTC (UTC+14).
    if (date.getTime() > this.now() + LATEST_ZONE_MS)
      throw new BadRequestError('body.birthday must not be in the future');
    if (date.getUTCFullYear() < 1900) throw new BadRequestError('body.birthday is too far in the past');
    return value;
  }
}

/** The picture as published (`withoutMetadata`); 400 for one that is unreadable or too large to show. */
function withoutMetadataOrRefuse(bytes: Buffer, type: string): Buffer | null {
  try {
    return withoutMetadata(bytes, type);
  } catch (err) {
    if (err instanceof ImageTooLargeError) throw new BadRequestError(`file ${err.message}`);
    throw err;
  }
}

/**
 * `value` in NFC, which may be longer than what was sent (U+FB2C is three characters in NFC): it
 * must still fit its column.
 */
function normalized(value: string, field: keyof typeof MAX_CHARACTERS): string {
  const text = value.normalize('NFC');
  const max = MAX_CHARACTERS[field];
  if (text !== value && [...text].length > max)
    throw new BadRequestError(`body.${field} must be at most ${max} characters (in Unicode NFC)`);
  return text;
}

function checkTags(tagJson: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(tagJson);
  } catch {
    throw new BadRequestError('body.tagJson must be a JSON array of strings');
  }
  const message =
    'body.tagJson must be a JSON array of at most 20 tags of 1 to 32 characters, visible, without control characters, unpaired surrogates or piles of combining marks';
  if (!Array.isArray(parsed) || parsed.length > 20) throw new BadRequestError(message);
  const tags: string[] = [];
  for (const raw of parsed) {
    const tag = typeof raw === 'string' ? raw.normalize('NFC').trim() : '';
    const characters = [...tag].length;
    if (characters < 1 || characters > 32 || !isSingleLine(tag) || !isVisible(tag))
      throw new BadRequestError(message);
    // The same tag twice is one tag.
    if (!tags.includes(tag)) tags.push(tag);
  }
  return JSON.stringify(tags);
}
