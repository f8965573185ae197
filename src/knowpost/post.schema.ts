import { Type, type Static } from 'typebox';
import { Nullable, SingleLine } from '../platform/http/schemas.js';

/**
 * Request and response shapes of the post write routes and of the upload presign route.
 * Business limits that a schema can state live here; rules that need the post (ownership, key
 * prefixes, state) live in the service.
 */

/** Snowflake ids as decimal strings; 63 bits never need more than 19 digits. */
export const PostId = Type.String({ pattern: '^[1-9][0-9]{0,18}$', maxLength: 19 });

export const PostIdParams = Type.Object({ id: PostId });

export const VISIBILITIES = ['public', 'followers', 'school', 'private', 'unlisted'] as const;
export type Visible = (typeof VISIBILITIES)[number];
export const Visible = Type.Union(VISIBILITIES.map((v) => Type.Literal(v)));

export const MAX_TAGS = 20;
export const MAX_IMAGES = 20;
export const MAX_IMAGE_URL_LENGTH = 1024;

export const DraftResponse = Type.Object({ id: Type.String() });

export const UploadScene = Type.Union([Type.Literal('knowpost_content'), Type.Literal('knowpost_image')]);
export type UploadScene = Static<typeof UploadScene>;

export const PresignBody = Type.Object({
  scene: UploadScene,
  postId: PostId,
  contentType: Type.String({ minLength: 3, maxLength: 128 }),
  ext: Type.Optional(Type.String({ minLength: 2, maxLength: 16 })),
});
export type PresignBody = Static<typeof PresignBody>;

export const PresignResponse = Type.Object({
  objectKey: Type.String(),
  putUrl: Type.String(),
  headers: Type.Object({ 'Content-Type': Type.String() }),
  expiresIn: Type.Integer(),
});
export type PresignResponse = Static<typeof PresignResponse>;

export const ConfirmBody = Type.Object({
  objectKey: Type.String({ minLength: 1, maxLength: 512 }),
  etag: Type.String({ minLength: 1, maxLength: 130 }),
  size: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }),
  sha256: Type.String({ pattern: '^[0-9a-fA-F]{64}$' }),
});
export type ConfirmBody = Static<typeof ConfirmBody>;

/**
 * `imgUrls` entries are either object keys of images uploaded for this post
 * (`posts/{id}/images/…`, as returned by presign; stored as copies under `posts/{id}/pictures/…`,
 * which a patch may also send back; readers get signed URLs for them) or absolute http(s) URLs of
 * images hosted elsewhere, in printable ASCII. A URL of one of this post's objects (an upload URL,
 * an image URL of a detail answer) stands for its key.
 */
export const PostPatchBody = Type.Object(
  {
    title: Type.Optional(SingleLine({ maxLength: 256 })),
    tagId: Type.Optional(
      Nullable(
        Type.Union([
          Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }),
          // As the original service took it too: a number written as a string of digits.
          Type.String({ pattern: '^(0|[1-9][0-9]{0,14})$' }),
        ]),
      ),
    ),
    tags: Type.Optional(Type.Array(SingleLine({ minLength: 1, maxLength: 64 }), { maxItems: MAX_TAGS })),
    imgUrls: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: MAX_IMAGE_URL_LENGTH }), { maxItems: MAX_IMAGES }),
    ),
    visible: Type.Optional(Visible),
    isTop: Type.Optional(Type.Boolean()),
    description: Type.Optional(SingleLine({ maxLength: 50 })),
  },
  { minProperties: 1 },
);
export type PostPatchBody = Static<typeof PostPatchBody>;
export const POST_PATCH_FIELDS = Object.keys(PostPatchBody.properties);

export const TopBody = Type.Object({ isTop: Type.Boolean() });

export const VisibilityBody = Type.Object({ visible: Visible });
