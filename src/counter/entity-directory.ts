import type { EntityRef } from './model.js';

/**
 * Whether an entity exists and who may see it. Likes, favourites and counts are served only for
 * entities the caller may see; anything else is a 404, so the counter routes cannot be used to probe
 * for drafts or private posts.
 */
export interface EntityDirectory {
  /** For each ref, whether `viewerId` (null: anonymous) may see it. */
  visible(refs: readonly EntityRef[], viewerId: number | null): Promise<boolean[]>;
}

export interface Visibility {
  authorId: number;
  status: 'draft' | 'published' | 'deleted';
  visible: string;
}

/**
 * Counters exist for published posts only. Anyone may see a public or unlisted one; a post for
 * followers, a school or its author alone is shown to its author (audiences arrive with relations).
 */
export function mayView(v: Visibility | null | undefined, viewerId: number | null): boolean {
  if (!v || v.status !== 'published') return false;
  return v.visible === 'public' || v.visible === 'unlisted' || (viewerId !== null && v.authorId === viewerId);
}

/**
 * Keeps what it learns of entities in process for `ttlMs`, so the like path runs no SQL for a post
 * that was seen recently. A post that stops being visible may still take likes for up to `ttlMs` in
 * processes that cached it; the post service calls `forget` in its own process on every change.
 */
export class CachedEntityDirectory implements EntityDirectory {
  private readonly cache = new Map<string, { value: Visibility | null; at: number }>();

  constructor(
    private readonly load: (refs: readonly EntityRef[]) => Promise<Map<string, Visibility>>,
    private readonly ttlMs: number,
    private readonly maxEntries = 100_000,
    private readonly now: () => number = Date.now,
  ) {}

  async visible(refs: readonly EntityRef[], viewerId: number | null): Promise<boolean[]> {
    const now = this.now();
    const keys = refs.map((r) => `${r.etype}:${r.eid}`);
    const missing = refs.filter((_, i) => {
      const hit = this.cache.get(keys[i] ?? '');
      return !hit || now - hit.at >= this.ttlMs;
    });
    if (missing.length > 0) {
      const loaded = await this.load(missing);
      for (const ref of missing) {
        const key = `${ref.etype}:${ref.eid}`;
        this.cache.delete(key);
        this.cache.set(key, { value: loaded.get(key) ?? null, at: now });
      }
      while (this.cache.size > this.maxEntries) {
        const oldest = this.cache.keys().next().value;
        if (oldest === undefined) break;
        this.cache.delete(oldest);
      }
    }
    return keys.map((key) => mayView(this.cache.get(key)?.value, viewerId));
  }

  forget(ref: EntityRef): void {
    this.cache.delete(`${ref.etype}:${ref.eid}`);
  }
}
