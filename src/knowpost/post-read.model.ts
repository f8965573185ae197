import type { ObjectStorage } from '../platform/storage/object-storage.js';
import { isExternalImageUrl, isImageKey, isReadableContentKey, isStoredImageKey } from './post-keys.js';
import type { PostReadRow } from './post-read.repository.js';

/**
 * A post as the read side serves it, before per-viewer fields (counts, liked, faved) are laid over
 * it. Presigned URLs are part of it, so a cached post carries URLs signed when it was loaded; they
 * are signed for `urlTtlSeconds`, far longer than any cache keeps them, and re-signed when a cached
 * copy has used up half of that (see `PostUrlSigner.refresh`).
 */
export interface PostView extends PostReadRow {
  contentUrl: string | null;
  /** `imgUrls` made fetchable: object keys presigned, absolute URLs as they are. */
  images: string[];
  /** When the presigned URLs above stop working (ms since epoch). */
  urlsExpireAt: number;
}

/**
 * Published and public: anyone may read it, it belongs in the public feed, and shared caches may
 * hold it. Every other visibility (`unlisted` too, as the contract has it) is its author's alone
 * until audiences are modelled.
 */
export function isListed(post: Pick<PostReadRow, 'status' | 'visible'>): boolean {
  return post.status === 'published' && post.visible === 'public';
}

/**
 * Who may read a post's detail: anyone when it is published and public; its author in any state but
 * deleted.
 */
export function mayRead(
  post: Pick<PostReadRow, 'status' | 'visible' | 'authorId'>,
  viewerId: number | null,
): boolean {
  if (isListed(post)) return true;
  return viewerId !== null && post.authorId === viewerId && post.status !== 'deleted';
}

/** Signs download URLs for a post's body and images. */
export class PostUrlSigner {
  constructor(
    private readonly storage: Pick<ObjectStorage, 'presignGet'>,
    private readonly urlTtlSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  async sign(row: PostReadRow): Promise<PostView> {
    const urlsExpireAt = this.now() + this.urlTtlSeconds * 1000;
    const [contentUrl, images] = await Promise.all([
      row.contentKey !== null && isReadableContentKey(row.id, row.contentKey)
        ? this.storage.presignGet(row.contentKey, this.urlTtlSeconds)
        : Promise.resolve(null),
      Promise.all(row.imgUrls.map((ref) => this.image(row.id, ref))),
    ]);
    return { ...row, contentUrl, images: images.filter((u): u is string => u !== null), urlsExpireAt };
  }

  /** The same post, with its URLs signed again when less than half of their validity is left. */
  async refresh(post: PostView): Promise<PostView> {
    if (post.urlsExpireAt - this.now() > (this.urlTtlSeconds * 1000) / 2) return post;
    return this.sign(post);
  }

  private async image(postId: string, ref: string): Promise<string | null> {
    if (isStoredImageKey(postId, ref) || isImageKey(postId, ref))
      return this.storage.presignGet(ref, this.urlTtlSeconds);
    if (isExternalImageUrl(ref)) return ref;
    // Neither of this post's image keys nor an absolute URL: not something the write side accepts.
    return null;
  }
}
