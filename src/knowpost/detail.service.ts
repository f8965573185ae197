import { NotFoundError } from '../platform/errors/errors.js';
import { AnonymousAnswers, type AnonymousAnswersOptions } from './anonymous-answers.js';
import { ZERO_COUNTS } from '../counter/model.js';
import { NO_FLAGS, refOf, type PostInteractions } from './feed.service.js';
import type { PostCache } from './post-cache.js';
import { isListed, mayRead } from './post-read.model.js';
import { detailResponseBytes, type Detail } from './read-answers.js';

/** Where a successful detail read reports its view (buffered, see `ViewRecorder`). */
export interface ViewSink {
  record(postId: string): void;
}

/**
 * One post for one viewer: published public posts for everyone, any post but a deleted
 * one for its author, 404 for everything else (so ids cannot be probed). The visibility check runs on
 * every read, cached or not; counts and flags are read live and never cached with the post.
 *
 * With `anonymous` set, the answer for callers who sent no token (the same for all of them: no
 * flags) is kept for a fraction of a second (see `AnonymousAnswers`); only answers of posts everyone
 * may read get there, and every read still records its view. A read of a post only its author may
 * see (a draft, a private post) records none: the author is not a reader.
 */
export class DetailService {
  private readonly anonymousAnswers: AnonymousAnswers | null;

  constructor(
    private readonly cache: PostCache,
    private readonly interactions: PostInteractions,
    private readonly views: ViewSink,
    private readonly anonymous?: AnonymousAnswersOptions,
  ) {
    this.anonymousAnswers =
      anonymous && anonymous.ttlMs > 0
        ? new AnonymousAnswers(
            () => cache.localGeneration,
            anonymous,
            (bytes: Buffer) => bytes.length,
          )
        : null;
  }

  /** `view: false` for a look that is no read (an HTTP HEAD request). */
  async detail(id: string, viewerId: number | null, view = true): Promise<Detail> {
    const detail = await this.read(id, viewerId, (refs) => this.interactions.counts(refs));
    // An author reading their own draft or private post is not a reader.
    if (view && isListed(detail.post)) this.views.record(id);
    return detail;
  }

  /** The answer for a caller who sent no token, as `detailResponseBytes` writes it. */
  async anonymousDetailBytes(id: string, view = true): Promise<Buffer> {
    const answers = this.anonymousAnswers;
    const counts = this.anonymous?.counts;
    if (!answers || !counts) return detailResponseBytes(await this.detail(id, null, view));
    const bytes = await answers.get(id, async () => detailResponseBytes(await this.read(id, null, counts)));
    if (view) this.views.record(id);
    return bytes;
  }

  private async read(
    id: string,
    viewerId: number | null,
    readCounts: PostInteractions['counts'],
  ): Promise<Detail> {
    const post = await this.cache.post(id);
    if (!post || !mayRead(post, viewerId)) throw new NotFoundError('No such post');
    const ref = refOf(id);
    // A draft (only its author reads it) has no counts, likes or favourites yet: none are looked
    // up, so no snapshot is made for it.
    const published = post.status === 'published';
    const [authors, [counts], [flags]] = await Promise.all([
      this.cache.authors([post.authorId]),
      published ? readCounts([ref]) : [ZERO_COUNTS],
      viewerId === null || !published ? Promise.resolve([]) : this.interactions.flags(viewerId, [ref]),
    ]);
    return { post, author: authors.get(post.authorId), counts, flags: flags ?? NO_FLAGS };
  }
}
