import type { UserCountPart } from '../user-counter/source.js';
import type { RelationRepository } from './relation.repository.js';

/**
 * `followings` and `followers` for user-counter rebuilds: counted in `following` (the truth), with
 * the changes whose deltas have not reached the counter store yet listed exactly — the
 * `relation_unapplied` marks written with each change and deleted by relation-proj once its deltas
 * are applied — read together in one transaction.
 */
export class RelationCountPart implements UserCountPart {
  readonly fields = ['followings', 'followers'] as const;

  constructor(private readonly repo: RelationRepository) {}

  async read(userId: number) {
    const { followings, followers, unapplied } = await this.repo.countSource(userId);
    return { counts: { followings, followers }, unapplied };
  }
}
