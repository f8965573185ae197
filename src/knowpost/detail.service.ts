import { NotFoundError } from '../platform/errors/errors.js';
import { NO_FLAGS, refOf, type PostInteractions } from './feed.service.js';
import type { PostCache } from './post-cache.js';
import { mayRead } from './post-read.model.js';
import type { Detail } from './read-answers.js';

/** Where a successful detail read reports its view (buffered, see `ViewRecorder`). */
export interface ViewSink {
  record(postId: string): void;
}

/**
 * One post for one viewer: published public or unlisted posts for everyone, any post but a deleted
 * one for its author, 404 for everything else (so ids cannot be probed). The visibility check runs on
 * every read, cached or not; counts and flags are read live and never cached with the post.
 */
export class DetailService {
  constructor(
    private readonly cache: PostCache,
    private readonly interactions: PostInteractions,
    private readonly views: ViewSink,
  ) {}

  async detail(id: string, viewerId: number | null): Promise<Detail> {
    const post = await this.cache.post(id);
    if (!post || !mayRead(post, viewerId)) throw new NotFoundError('No such post');
    const ref = refOf(id);
    const [authors, [counts], [flags]] = await Promise.all([
      this.cache.authors([post.authorId]),
      this.interactions.counts([ref]),
      viewerId === null ? Promise.resolve([]) : this.interactions.flags(viewerId, [ref]),
    ]);
    this.views.record(id);
    return { post, author: authors.get(post.authorId), counts, flags: flags ?? NO_FLAGS };
  }
}
