import { randomUUID } from 'node:crypto';
import { backoffMs } from '../workers/backoff.js';
import {
  Admin,
  ConfigResourceTypes,
  Consumer,
  FetchIsolationLevels,
  IncrementalAlterConfigOperationTypes,
  IS_CONTROL,
  ListOffsetTimestamps,
  MessagesStreamFallbackModes,
  MessagesStreamModes,
  ProduceAcks,
  Producer,
  stringDeserializers,
  stringSerializers,
  type Message,
  type MessagesStream,
} from '@platformatic/kafka';
import {
  PublishTimeoutError,
  type Batch,
  type DeliveredRecord,
  type EndOffsets,
  type EventLog,
  type EventRecord,
  type SubscribeOptions,
  type Subscription,
} from './eventlog.js';

export interface KafkaEventLogOptions {
  brokers: string[];
  /** Prepended to every topic and group name; callers never see it. */
  prefix?: string;
  /** Partitions of topics created by `ensureTopics`. */
  partitions?: number;
  /** Replication factor of created topics; -1 leaves it to the broker's default. */
  replicationFactor?: number;
  clientId?: string;
  connectTimeoutMs?: number;
  /** Bound of one request to the broker. */
  requestTimeoutMs?: number;
  /** Retries of one operation inside the client before it gives up. */
  retries?: number;
  retryDelayMs?: number;
  /** Upper bound of one `publish`, whatever the client does internally. */
  publishTimeoutMs?: number;
  sessionTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  /** First and longest wait before a subscription retries after a failure. */
  retryBackoffMs?: { min: number; max: number };
  /**
   * A subscription's fetch is answered once this many bytes are there, or after `fetchMaxWaitMs`.
   * Under steady load this turns a fetch per handful of records into one per few hundred, which is
   * most of the broker's and the consumers' cost; it delays a record by at most `fetchMaxWaitMs`.
   */
  fetchMinBytes?: number;
  /** Longest a subscription's fetch waits at the broker for `fetchMinBytes`. */
  fetchMaxWaitMs?: number;
  /**
   * This process's name among the deployment's, for static group membership: a subscription's
   * member is `<clientId>-<memberName>-<group>-<n>` (the n-th subscription of the group in this
   * log), so a process started again under the same name takes its predecessor's partitions over at
   * once instead of waiting out the dead member's session (about 10 s in which nothing of those
   * partitions is handled). Two running processes of one name would take the member from each other
   * in turn: a subscription that sees that goes on under a member of its own. Without a name every
   * subscription is a member of its own.
   */
  memberName?: string;
  /**
   * Told once per subscription that gives its member name up (see `memberName`), in place of its
   * `onError`: that is for failures of its own, and this one is the deployment's to fix.
   */
  onNameGivenUp?: (err: Error) => void;
}

type Settings = Required<Omit<KafkaEventLogOptions, 'brokers' | 'memberName' | 'onNameGivenUp'>> & {
  brokers: string[];
  memberName: string | undefined;
  onNameGivenUp: ((err: Error) => void) | undefined;
};
type StringConsumer = Consumer<string, string, string, string>;
type StringStream = MessagesStream<string, string, string, string>;
type StringMessage = Message<string, string, string, string>;
type FetchResponse = Awaited<ReturnType<StringConsumer['fetch']>>;

const DEFAULT_MAX_BATCH = 100;
const DEFAULT_MAX_WAIT_MS = 100;
/** Offset commits failing in a row before a subscription makes its consumer anew (see `pump`). */
const MAX_COMMIT_FAILURES = 5;

/**
 * A commit without an answer in time. The client goes on trying it (and may land it after a later
 * commit, moving the group's offsets back), so only making the consumer anew ends it.
 */
class CommitTimedOut extends Error {}

/** Most bytes one range-read fetch returns (per partition and in all). */
const FETCH_MAX_BYTES = 8 * 1024 * 1024;
const DEFAULT_FETCH_MIN_BYTES = 32 * 1024;
const DEFAULT_FETCH_MAX_WAIT_MS = 50;
/** Most bytes one fetch of a subscription returns. */
const SUBSCRIBE_FETCH_MAX_BYTES = 4 * 1024 * 1024;
/** A named member taken over this often within the window gives its name up (see `noteTakeover`). */
const TAKEOVERS = 6;
const TAKEOVER_WINDOW_MS = 15_000;

/**
 * Event log on Apache Kafka. Records are keyed, so the default partitioner keeps a key on one
 * partition and its records in order; the producer is idempotent with acks from all in-sync replicas.
 *
 * A subscription is one group member reading one `MessagesStream` with auto-commit off. The stream
 * fetches ahead of the handler, so its in-memory position cannot be rewound: after a handler failure
 * the stream is thrown away and a new one starts from the group's committed offsets; after a lost
 * connection or group membership the whole consumer is recreated.
 */
export class KafkaEventLog implements EventLog {
  private readonly s: Settings;
  private readonly producer: Producer<string, string, string, string>;
  private readonly admin: Admin;
  private reader: StringConsumer | undefined;
  private readonly subscriptions = new Set<KafkaSubscription>();
  private closed = false;

  constructor(options: KafkaEventLogOptions) {
    if (options.brokers.length === 0) throw new Error('KafkaEventLog needs at least one broker');
    this.s = {
      brokers: options.brokers,
      prefix: options.prefix ?? '',
      partitions: options.partitions ?? 6,
      replicationFactor: options.replicationFactor ?? -1,
      clientId: options.clientId ?? 'zhiguang',
      connectTimeoutMs: options.connectTimeoutMs ?? 3_000,
      requestTimeoutMs: options.requestTimeoutMs ?? 10_000,
      retries: options.retries ?? 3,
      retryDelayMs: options.retryDelayMs ?? 250,
      publishTimeoutMs: options.publishTimeoutMs ?? 15_000,
      sessionTimeoutMs: options.sessionTimeoutMs ?? 10_000,
      heartbeatIntervalMs: options.heartbeatIntervalMs ?? 1_000,
      retryBackoffMs: options.retryBackoffMs ?? { min: 200, max: 10_000 },
      fetchMinBytes: options.fetchMinBytes ?? DEFAULT_FETCH_MIN_BYTES,
      fetchMaxWaitMs: options.fetchMaxWaitMs ?? DEFAULT_FETCH_MAX_WAIT_MS,
      memberName: options.memberName,
      onNameGivenUp: options.onNameGivenUp,
    };
    this.producer = new Producer({
      ...this.clientOptions('producer'),
      serializers: stringSerializers,
      idempotent: true,
      acks: ProduceAcks.ALL,
    });
    this.admin = new Admin(this.clientOptions('admin'));
  }

  /**
   * Options every client shares. `retries` stays at 2 or more: the client turns a lower value into
   * "retry forever" for an idempotent producer, and publish would then hang through an outage.
   */
  private clientOptions(role: string): {
    clientId: string;
    bootstrapBrokers: string[];
    connectTimeout: number;
    requestTimeout: number;
    timeout: number;
    retries: number;
    retryDelay: number;
  } {
    return {
      clientId: `${this.s.clientId}-${role}`,
      bootstrapBrokers: this.s.brokers,
      connectTimeout: this.s.connectTimeoutMs,
      requestTimeout: this.s.requestTimeoutMs,
      timeout: this.s.requestTimeoutMs,
      retries: Math.max(2, this.s.retries),
      retryDelay: this.s.retryDelayMs,
    };
  }

  /** Used by subscriptions. */
  get settings(): Readonly<Settings> {
    return this.s;
  }

  /** The broker-side name of a topic or group. */
  name(topic: string): string {
    return this.s.prefix + topic;
  }

  unprefix(topic: string): string {
    return topic.startsWith(this.s.prefix) ? topic.slice(this.s.prefix.length) : topic;
  }

  async ensureTopics(topics: string[], options: { keepForever?: readonly string[] } = {}): Promise<void> {
    const names = [...new Set(topics.map((t) => this.name(t)))];
    if (names.length === 0) return;
    try {
      await this.admin.createTopics({
        topics: names,
        partitions: this.s.partitions,
        replicas: this.s.replicationFactor,
      });
    } catch (err) {
      if (!everyError(err, (e) => e.apiId === 'TOPIC_ALREADY_EXISTS')) throw err;
    }
    const forever = [...new Set((options.keepForever ?? []).map((t) => this.name(t)))];
    if (forever.length > 0) {
      // Set on every start, so a topic created before (or by hand) is kept whole too.
      await this.admin.incrementalAlterConfigs({
        resources: forever.map((resourceName) => ({
          resourceType: ConfigResourceTypes.TOPIC,
          resourceName,
          configs: [
            { name: 'retention.ms', configOperation: IncrementalAlterConfigOperationTypes.SET, value: '-1' },
          ],
        })),
      });
    }
    await this.waitForLeaders(names);
  }

  /** Removes topics (tests and tooling); missing ones are ignored. */
  async deleteTopics(topics: string[]): Promise<void> {
    const names = [...new Set(topics.map((t) => this.name(t)))];
    if (names.length === 0) return;
    try {
      await this.admin.deleteTopics({ topics: names });
    } catch (err) {
      if (!everyError(err, (e) => e.apiId === 'UNKNOWN_TOPIC_OR_PARTITION' || e.apiId === 'UNKNOWN_TOPIC_ID'))
        throw err;
    }
  }

  /** Removes consumer groups with their committed offsets (tests and tooling); missing ones are ignored. */
  async deleteGroups(groups: string[]): Promise<void> {
    const names = [...new Set(groups.map((g) => this.name(g)))];
    if (names.length === 0) return;
    try {
      await this.admin.deleteGroups({ groups: names });
    } catch (err) {
      if (!everyError(err, (e) => e.apiId === 'GROUP_ID_NOT_FOUND')) throw err;
    }
  }

  async publish(topic: string, records: EventRecord[]): Promise<void> {
    if (this.closed) throw new Error('event log is closed');
    if (records.length === 0) return;
    const name = this.name(topic);
    const send = this.producer
      .send({ messages: records.map((r) => ({ topic: name, key: r.key, value: r.value })) })
      .then(() => undefined);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new PublishTimeoutError(`publish to ${topic} timed out`, send)),
        this.s.publishTimeoutMs,
      );
    });
    await Promise.race([send, timeout]).finally(() => clearTimeout(timer));
  }

  async subscribe(options: SubscribeOptions): Promise<Subscription> {
    if (this.closed) throw new Error('event log is closed');
    if (options.topics.length === 0) throw new Error('subscribe needs at least one topic');
    const group = this.name(options.group);
    const sub = new KafkaSubscription(
      this,
      options,
      () => this.subscriptions.delete(sub),
      this.freeSlot(group),
    );
    this.subscriptions.add(sub);
    try {
      await sub.start();
    } catch (err) {
      this.subscriptions.delete(sub);
      throw err;
    }
    return sub;
  }

  /** The lowest member number no live subscription of `group` has; undefined without a member name. */
  private freeSlot(group: string): number | undefined {
    if (this.s.memberName === undefined) return undefined;
    const taken = new Set([...this.subscriptions].filter((s) => s.group === group).map((s) => s.slot));
    let slot = 0;
    while (taken.has(slot)) slot++;
    return slot;
  }

  async endOffsets(topic: string): Promise<EndOffsets> {
    const name = this.name(topic);
    const offsets = await this.readerConsumer().listOffsets({
      topics: [name],
      timestamp: ListOffsetTimestamps.LATEST,
    });
    const partitions = offsets.get(name) ?? [];
    return new Map(partitions.map((offset, partition) => [partition, offset]));
  }

  async committedOffsets(group: string, topic: string): Promise<EndOffsets> {
    const name = this.name(topic);
    const groups = await this.admin.listConsumerGroupOffsets({ groups: [this.name(group)] });
    const committed: EndOffsets = new Map();
    for (const { topics } of groups)
      for (const t of topics)
        if (t.name === name)
          for (const p of t.partitions)
            if (p.committedOffset >= 0n) committed.set(p.partitionIndex, p.committedOffset);
    return committed;
  }

  async groupMembers(group: string): Promise<number> {
    try {
      const groups = await this.admin.describeGroups({ groups: [this.name(group)] });
      let members = 0;
      for (const described of groups.values()) members += described.members.size;
      return members;
    } catch (err) {
      if (everyError(err, (e) => e.apiId === 'GROUP_ID_NOT_FOUND')) return 0;
      throw err;
    }
  }

  /**
   * Every partition still starts at offset 0. A topic deleted and made anew starts at 0 too: that
   * this cannot tell (nor would any offset).
   */
  async holdsEveryRecord(topic: string): Promise<boolean> {
    const name = this.name(topic);
    const earliest = await this.readerConsumer().listOffsets({
      topics: [name],
      timestamp: ListOffsetTimestamps.EARLIEST,
    });
    const partitions = earliest.get(name) ?? [];
    // No answer for the topic is no answer: "cannot tell".
    return partitions.length > 0 && partitions.every((offset) => offset === 0n);
  }

  /**
   * Reads with plain Fetch requests, so no group is joined and no offset is committed anywhere. The
   * partitions' leaders are resolved once (again only after a failed fetch); each round sends one
   * request per leader for all of its unfinished partitions, and the next round's requests go out
   * while the handler works through this round's records. Each partition's records are handed over
   * in offset order; records of different partitions interleave.
   */
  async readRange(
    topic: string,
    until: EndOffsets,
    handler: (batch: Batch) => Promise<void>,
    maxBatch = 500,
    from?: EndOffsets,
  ): Promise<void> {
    const name = this.name(topic);
    const reader = this.readerConsumer();
    const earliest =
      (await reader.listOffsets({ topics: [name], timestamp: ListOffsetTimestamps.EARLIEST })).get(name) ??
      [];
    const positions = new Map<number, bigint>();
    for (const [partition, end] of [...until].sort((a, b) => a[0] - b[0])) {
      const oldest = earliest[partition] ?? 0n;
      const wanted = from?.get(partition) ?? 0n;
      const start = wanted > oldest ? wanted : oldest;
      if (start < end) positions.set(partition, start);
    }
    if (positions.size === 0) return;

    let leaders = await this.leadersOf(reader, name, topic, [...positions.keys()], false);
    let failures = 0;
    let idleRounds = 0;
    let buffer: DeliveredRecord[] = [];
    const flush = async (): Promise<void> => {
      if (buffer.length === 0) return;
      const records = buffer;
      buffer = [];
      await handler({ topic, records });
    };
    const fetchRound = (): Promise<FetchResponse[]> => {
      const requests: Promise<FetchResponse>[] = [];
      for (const [node, partitions] of leaders.byNode) {
        const open = partitions.filter((p) => positions.has(p));
        // A leader whose partitions are all read is left out (an empty fetch would wait maxWaitTime).
        if (open.length === 0) continue;
        requests.push(
          reader.fetch({
            node,
            topics: [
              {
                topicId: leaders.topicId,
                partitions: open.map((partition) => ({
                  partition,
                  fetchOffset: positions.get(partition)!,
                  partitionMaxBytes: FETCH_MAX_BYTES,
                  currentLeaderEpoch: -1,
                  lastFetchedEpoch: -1,
                })),
              },
            ],
            maxWaitTime: 100,
            minBytes: 1,
            maxBytes: FETCH_MAX_BYTES,
          }),
        );
      }
      return Promise.all(requests);
    };
    // Fetches are only ever started with the positions advanced past every record already taken.
    let next: Promise<FetchResponse[]> | undefined = fetchRound();
    while (next) {
      let responses: FetchResponse[];
      try {
        responses = await next;
      } catch (err) {
        if (++failures > Math.max(2, this.s.retries)) throw err;
        await delay(this.s.retryDelayMs);
        leaders = await this.leadersOf(reader, name, topic, [...positions.keys()], true);
        next = fetchRound();
        continue;
      }
      failures = 0;
      const taken: DeliveredRecord[] = [];
      let progressed = false;
      for (const topicResponse of responses.flatMap((r) => r.responses)) {
        for (const part of topicResponse.partitions) {
          const partition = part.partitionIndex;
          const from = positions.get(partition);
          if (from === undefined) continue;
          const end = until.get(partition)!;
          let position = from;
          for (const batch of part.records ?? []) {
            if ((batch.attributes & IS_CONTROL) === 0) {
              for (const record of batch.records) {
                const offset = batch.firstOffset + BigInt(record.offsetDelta);
                if (offset < position || offset >= end) continue;
                taken.push({
                  topic,
                  partition,
                  offset,
                  key: record.key?.toString('utf8') ?? '',
                  value: record.value?.toString('utf8') ?? '',
                  timestamp: Number(batch.firstTimestamp + record.timestampDelta),
                });
              }
            }
            const after = batch.firstOffset + BigInt(batch.lastOffsetDelta) + 1n;
            if (after > position) position = after;
          }
          if (position === from) continue;
          progressed = true;
          if (position >= end) positions.delete(partition);
          else positions.set(partition, position);
        }
      }
      if (progressed) idleRounds = 0;
      else if (++idleRounds > 50) {
        const stuck = [...positions].map(([p, o]) => `${p}@${o}`).join(', ');
        throw new Error(`reading ${topic} made no progress (partition@offset: ${stuck})`);
      }
      next = positions.size > 0 ? fetchRound() : undefined;
      // Hand over what this round brought while the next round is on its way.
      try {
        for (const record of taken) {
          buffer.push(record);
          if (buffer.length >= maxBatch) await flush();
        }
      } catch (err) {
        await next?.catch(() => undefined);
        throw err;
      }
    }
    await flush();
  }

  /** The topic's id and, per leader, the given partitions it leads. */
  private async leadersOf(
    reader: StringConsumer,
    name: string,
    topic: string,
    partitions: number[],
    forceUpdate: boolean,
  ): Promise<{ topicId: string; byNode: Map<number, number[]> }> {
    const metadata = await reader.metadata({ topics: [name], forceUpdate });
    const meta = metadata.topics.get(name);
    if (!meta) throw new Error(`no metadata for ${topic}`);
    const byNode = new Map<number, number[]>();
    for (const partition of partitions) {
      const leader = meta.partitions[partition]?.leader;
      if (leader === undefined || leader < 0) throw new Error(`no leader for ${topic}/${partition}`);
      const list = byNode.get(leader);
      if (list) list.push(partition);
      else byNode.set(leader, [partition]);
    }
    return { topicId: meta.id, byNode };
  }

  async ping(): Promise<boolean> {
    try {
      await withTimeout(this.admin.metadata({ topics: [], forceUpdate: true }), 3_000, 'ping timed out');
      return true;
    } catch {
      return false;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([...this.subscriptions].map((s) => s.close()));
    await Promise.allSettled([
      withTimeout(this.producer.close(true), 10_000, 'closing the producer timed out'),
      withTimeout(this.admin.close(), 10_000, 'closing the admin client timed out'),
      this.reader
        ? withTimeout(this.reader.close(true), 10_000, 'closing the reader timed out')
        : Promise.resolve(),
    ]);
  }

  createConsumer(
    group: string,
    maxBatch: number,
    instanceId?: string,
    fetchMaxWaitMs = this.s.fetchMaxWaitMs,
  ): StringConsumer {
    return new Consumer({
      ...this.clientOptions('consumer'),
      groupId: this.name(group),
      ...(instanceId ? { groupInstanceId: instanceId } : {}),
      deserializers: stringDeserializers,
      autocommit: false,
      sessionTimeout: this.s.sessionTimeoutMs,
      rebalanceTimeout: Math.max(this.s.sessionTimeoutMs, 30_000),
      heartbeatInterval: this.s.heartbeatIntervalMs,
      heartbeatStallTimeout: this.s.sessionTimeoutMs,
      // The broker answers a fetch once `fetchMinBytes` are there or after `fetchMaxWaitMs`, so a
      // steady trickle of records arrives in a few large fetches instead of one fetch each.
      minBytes: this.s.fetchMinBytes,
      maxWaitTime: fetchMaxWaitMs,
      highWaterMark: Math.max(2 * maxBatch, 64),
      // The client's default (50 MB) makes a consumer behind by a large backlog decode all of it
      // before the first batch is handed over; smaller fetches let decoding overlap the handler.
      maxBytes: SUBSCRIBE_FETCH_MAX_BYTES,
      isolationLevel: FetchIsolationLevels.READ_COMMITTED,
    });
  }

  private readerConsumer(): StringConsumer {
    // Never joins its group: it only lists offsets and fetches.
    this.reader ??= new Consumer({
      ...this.clientOptions('reader'),
      groupId: this.name(`__reader-${randomUUID()}`),
      deserializers: stringDeserializers,
      autocommit: false,
      isolationLevel: FetchIsolationLevels.READ_COMMITTED,
    });
    return this.reader;
  }

  private async waitForLeaders(names: string[]): Promise<void> {
    const deadline = Date.now() + Math.max(10_000, this.s.requestTimeoutMs);
    for (;;) {
      try {
        const metadata = await this.admin.metadata({ topics: names, forceUpdate: true });
        const ready = names.every((n) => {
          const t = metadata.topics.get(n);
          return t !== undefined && t.partitionsCount > 0 && t.partitions.every((p) => p.leader >= 0);
        });
        if (ready) return;
      } catch (err) {
        if (Date.now() > deadline) throw err;
      }
      if (Date.now() > deadline) throw new Error(`topics ${names.join(', ')} have no leaders yet`);
      await delay(100);
    }
  }
}

class HandlerFailed extends Error {
  constructor(cause: unknown) {
    super('batch handler failed', { cause });
  }
}

/**
 * One group member. `run` owns the consumer and the stream; everything else only signals it.
 */
class KafkaSubscription implements Subscription {
  private readonly topics: string[];
  private readonly maxBatch: number;
  private readonly maxWaitMs: number;
  private readonly commitIntervalMs: number;
  private consumer: StringConsumer | undefined;
  private reader: StreamReader | undefined;
  private closing = false;
  private loop: Promise<void> | undefined;
  private readonly sleeper = new Sleeper();
  private pinned = false;
  private consumerFailed = false;
  /**
   * Times the consumer joined its group. A join moves partitions and has the stream read them again
   * from their committed offsets, so what was handled before it is not committed after it: the
   * partition may have been another member's meanwhile, which committed further.
   */
  private joins = 0;
  /**
   * Per partition held, the group's committed offset when the consumer last joined (`floorsOf`
   * says which join). The stream keeps records it fetched before a join and hands them over after
   * it; another member may have held the partition meanwhile and handled and committed them. One
   * below it is neither handled again (counted twice) nor committed (moving the group back). Taken
   * anew at each join from the group's own offsets, it never skips a record a new member would read,
   * whatever happened to the topic or the group's offsets meanwhile.
   */
  private floors = new Map<string, bigint>();
  private floorsOf = -1;
  /**
   * Static group membership, one id per subscription: a consumer recreated after the broker was
   * lost takes over its predecessor's member and assignment at once, instead of waiting a session
   * timeout for the dead member to expire (counting would otherwise lag ~10 s after an outage). With
   * the log's `memberName` the id outlives the process too (see `KafkaEventLogOptions`).
   */
  private instanceId: string;
  /** The broker-side group name. */
  readonly group: string;
  /** Whether the member id is the log's name for this subscription (see `noteTakeover`). */
  private named: boolean;
  /** Times the named member was taken over within the window, to see another running process take it in turn. */
  private readonly recentTakeovers: number[] = [];
  /** Set when the named member was taken over in turn: the reason, until the consumer is made anew. */
  private takenOver: Error | undefined;

  constructor(
    private readonly log: KafkaEventLog,
    private readonly options: SubscribeOptions,
    private readonly onClosed: () => void,
    /** This subscription's number among the log's of its group, when the log has a member name. */
    readonly slot: number | undefined,
  ) {
    this.topics = [...new Set(options.topics.map((t) => log.name(t)))];
    this.maxBatch = Math.max(1, options.maxBatch ?? DEFAULT_MAX_BATCH);
    this.maxWaitMs = Math.max(0, options.maxWaitMs ?? DEFAULT_MAX_WAIT_MS);
    this.commitIntervalMs = Math.max(0, options.commitIntervalMs ?? 0);
    this.group = log.name(options.group);
    const { clientId, memberName } = log.settings;
    this.named = slot !== undefined && memberName !== undefined;
    // The broker takes letters, digits, '.', '_' and '-' in an id, up to 249 of them.
    this.instanceId = this.named
      ? `${clientId}-${memberName}-${this.group}-${slot}`.replace(/[^\w.-]/g, '_').slice(-249)
      : `${clientId}-${randomUUID()}`;
  }

  /**
   * The named member was joined under a new member id: another member of its name took it (the
   * client then forgets its member id and joins again, taking it back). A rebalance keeps the member
   * id, however many there are. Taken over this often, as two running processes of one name take it
   * from each other in turn, the subscription gives its name up: the consumer is made anew under an
   * id of its own.
   */
  private noteTakeover(): void {
    if (!this.named) return;
    const now = Date.now();
    this.recentTakeovers.push(now);
    while (now - this.recentTakeovers[0]! > TAKEOVER_WINDOW_MS) this.recentTakeovers.shift();
    if (this.recentTakeovers.length < TAKEOVERS) return;
    this.takenOver = new Error(
      `consumer group ${this.group}: member ${this.instanceId} was taken over ${TAKEOVERS} times in ${TAKEOVER_WINDOW_MS / 1000} s, ` +
        'as when another running process has the same name (host name, ZG_NODE_ID and role: give every process its own ZG_NODE_ID); ' +
        'going on under a member of its own',
    );
    this.named = false;
    this.instanceId = `${this.log.settings.clientId}-${randomUUID()}`;
    this.consumerFailed = true;
    // Said here, once: the reader may already hold another failure, or not exist yet (the loop
    // does not report this one again).
    const tell = this.log.settings.onNameGivenUp;
    if (tell) {
      try {
        tell(this.takenOver);
      } catch {
        // A failing reporter must not stop the subscription.
      }
    } else this.report(this.takenOver);
    this.reader?.fail(this.takenOver);
  }

  async start(): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.open();
        break;
      } catch (err) {
        await this.teardown(true);
        // A name another process holds is given up while joining (see `noteTakeover`): joined again.
        if (attempt > 0 || this.takenOver === undefined) throw err;
      }
    }
    this.loop = this.run();
  }

  async close(): Promise<void> {
    if (!this.closing) {
      this.closing = true;
      this.sleeper.stop();
      this.reader?.interrupt();
    }
    await this.loop;
  }

  private async run(): Promise<void> {
    let failures = 0;
    try {
      while (!this.closing) {
        try {
          if (!this.consumer || !this.reader) await this.open();
          await this.pump(() => (failures = 0));
        } catch (err) {
          if (this.closing) break;
          const handlerFailed = err instanceof HandlerFailed;
          const failure = handlerFailed ? err.cause : err;
          if (failure !== this.takenOver) this.report(failure);
          // A handler that failed as its consumer did: the consumer is made anew (see `open`); a
          // failure of anything else may have left it broken.
          await this.teardown(!handlerFailed);
          const wait = backoffMs(this.log.settings.retryBackoffMs, failures);
          failures++;
          await this.sleeper.sleep(wait);
        }
      }
    } finally {
      await this.teardown(true);
      this.onClosed();
    }
  }

  private async open(): Promise<void> {
    if (this.consumer && this.consumerFailed) await this.teardown(true);
    if (!this.consumer) {
      this.consumerFailed = false;
      this.takenOver = undefined;
      const consumer = this.log.createConsumer(
        this.options.group,
        this.maxBatch,
        this.instanceId,
        this.options.fetchMaxWaitMs,
      );
      this.consumer = consumer;
      // An unhandled 'error' event would crash the process, and a failed rejoin also ends the
      // heartbeats; the listeners stay attached (and go quiet) once this consumer is replaced.
      consumer.on('error', (err: Error) => {
        if (this.consumer !== consumer) return;
        this.consumerFailed = true;
        this.reader?.fail(err);
      });
      let memberId: string | null | undefined;
      consumer.on('consumer:group:join', (payload: { memberId?: string | null }) => {
        if (this.consumer !== consumer) return;
        this.joins++;
        const previous = memberId;
        memberId = payload.memberId;
        if (previous !== undefined && memberId !== previous) this.noteTakeover();
      });
      consumer.on('consumer:heartbeat:stalled', (payload) => {
        if (this.consumer !== consumer) return;
        this.consumerFailed = true;
        this.reader?.fail(new Error('consumer heartbeat stalled', { cause: payload.lastError }));
      });
    }
    const stream = await withTimeout(
      this.consumer.consume({
        topics: this.topics,
        mode: MessagesStreamModes.COMMITTED,
        fallbackMode: this.options.fromLatest
          ? MessagesStreamFallbackModes.LATEST
          : MessagesStreamFallbackModes.EARLIEST,
        autocommit: false,
      }),
      this.log.settings.requestTimeoutMs + this.log.settings.sessionTimeoutMs,
      'joining the consumer group timed out',
    );
    this.reader = new StreamReader(stream);
    // Taken over while joining: made anew at once under its own id (see `noteTakeover`).
    if (this.takenOver) this.reader.fail(this.takenOver);
    await this.reader.positioned(this.log.settings.requestTimeoutMs);
    if (this.options.fromLatest && !this.pinned) {
      await this.pinPositions(stream);
      this.pinned = true;
    }
  }

  /**
   * A `fromLatest` group with no commits would otherwise start from the then-latest offsets again
   * after every restart and skip whatever was published in between.
   */
  private async pinPositions(stream: StringStream): Promise<void> {
    const consumer = this.consumer!;
    const assignments = consumer.assignments ?? [];
    if (assignments.length === 0) return;
    const committed = await consumer.listCommittedOffsets({
      topics: assignments.map((a) => ({ topic: a.topic, partitions: a.partitions })),
    });
    const offsets = [];
    for (const { topic, partitions } of assignments) {
      for (const partition of partitions) {
        if ((committed.get(topic)?.[partition] ?? -1n) >= 0n) continue;
        const offset = stream.offsetsToFetch.get(`${topic}:${partition}`);
        if (offset !== undefined) offsets.push({ topic, partition, offset, leaderEpoch: -1 });
      }
    }
    if (offsets.length > 0) {
      await withTimeout(consumer.commit({ offsets }), this.log.settings.requestTimeoutMs, 'commit timed out');
    }
  }

  /**
   * Hands batches to the handler. Once a batch's handler resolved, its offsets are committed, or,
   * with `commitIntervalMs`, gathered with the next batches' until that long after the last commit
   * (when no batch comes, the wait for one ends then). A commit runs while the next batch is read
   * and handled; it is awaited before the next commit (so commits stay in order) and before `pump`
   * returns or throws. A commit refused without a rebalance (a coordinator moving) is reported and
   * its offsets go out again with the next commit, after a back-off, on the same stream: throwing
   * the stream away would hand its records again from the last commit (and every handler handle
   * them again). After
   * `MAX_COMMIT_FAILURES` failures in a row, a commit without an answer in time (the client goes on
   * with it), or once the consumer itself failed, the error surfaces and the records since the last
   * commit are delivered again: at-least-once, as the handler already expects. What was handed
   * over before the group was joined again is not committed (see `joins`), and what the group
   * committed meanwhile is neither handed again nor committed behind (see `floors`). Leaving because of
   * `close` commits whatever was handled.
   */
  private async pump(onProgress: () => void): Promise<void> {
    const reader = this.reader!;
    // Never rejects, so it cannot go unhandled: a failure is dealt with where it happens.
    let committing: Promise<void> | undefined;
    // A commit failure that ends the stream, thrown by the next `settleCommit`.
    let fatal: Error | undefined;
    // Handled and not committed yet: the last record of each partition, and `joins` when handed over.
    let handled = new Map<string, { m: StringMessage; joins: number }>();
    const keep = (m: StringMessage, joins: number): void => {
      const key = `${m.topic}:${m.partition}`;
      const seen = handled.get(key);
      if (!seen || seen.joins < joins || (seen.joins === joins && seen.m.offset < m.offset))
        handled.set(key, { m, joins });
    };
    let lastCommitAt = Number.NEGATIVE_INFINITY;
    let failedCommits = 0;
    const commitDue = (): boolean => Date.now() - lastCommitAt >= this.commitIntervalMs;
    const settleCommit = async (): Promise<void> => {
      await committing;
      committing = undefined;
      const error = fatal;
      fatal = undefined;
      if (error) throw error;
    };
    const commitHandled = async (force = false): Promise<void> => {
      await settleCommit();
      if (handled.size === 0 || !(force || commitDue())) return;
      const joins = this.joins;
      const records = [...handled.values()].filter((h) => h.joins === joins).map((h) => h.m);
      handled = new Map();
      lastCommitAt = Date.now();
      if (records.length === 0) return;
      committing = this.commit(records).then(
        () => void (failedCommits = 0),
        (err: unknown) => {
          const error = err instanceof Error ? err : new Error('commit failed', { cause: err });
          failedCommits++;
          if (this.consumerFailed || err instanceof CommitTimedOut || failedCommits >= MAX_COMMIT_FAILURES)
            fatal = error;
          else {
            this.report(error);
            // Kept for the next commit, which goes out after a back-off.
            for (const m of records) keep(m, joins);
            const backoff = backoffMs(this.log.settings.retryBackoffMs, failedCommits - 1);
            lastCommitAt = Date.now() + backoff - this.commitIntervalMs;
          }
          // A reader waiting for records with nothing left to commit would wait on.
          reader.wake();
        },
      );
    };
    try {
      while (!this.closing) {
        const idleMs =
          handled.size > 0 ? Math.max(0, lastCommitAt + this.commitIntervalMs - Date.now()) : undefined;
        const messages = await reader.next(this.maxBatch, this.maxWaitMs, idleMs);
        // Records are of the group's membership when they were handed over: a join while they are
        // handled may have moved their partition away and back, with another member committing
        // further. (Records the stream fetched before a join and hands over after it count as of
        // the new one.)
        const joinsAtRead = this.joins;
        if (messages.length === 0) {
          if (fatal !== undefined || commitDue()) await commitHandled();
          continue;
        }
        let closed = false;
        for (const [topic, delivered] of groupByTopic(messages)) {
          const records = await this.handle(topic, delivered);
          if (records === null) {
            closed = true;
            break;
          }
          for (const m of records) keep(m, joinsAtRead);
          if (commitDue()) await commitHandled();
        }
        if (closed) break;
        onProgress();
      }
      // Leaving because of `close`: a commit that fails now is said (its records come again).
      try {
        await commitHandled(true);
        await settleCommit();
      } catch (err) {
        this.report(err);
      }
    } catch (err) {
      await committing;
      throw err;
    }
  }

  /**
   * Hands records to the handler until it takes them. A failure is reported and the same records
   * are handed again after a back-off, on the same stream: a new stream would make the consumer join
   * its group again, which, coming from the group's leader, rebalances every member, so a Redis or
   * database outage would stop the whole group every second. Each try hands over only the records
   * of partitions this member still holds: the group may have handed the others to another member
   * meanwhile (which reads them from the last commit). Resolves to the records handled, or null
   * when the subscription closes meanwhile (the records stay uncommitted); throws when the consumer
   * itself failed, for `run` to make a new one.
   */
  private async handle(topic: string, delivered: StringMessage[]): Promise<StringMessage[] | null> {
    let records = delivered;
    for (let failures = 0; ; failures++) {
      try {
        // Records read before the group moved a partition elsewhere (the stream's buffer keeps them)
        // are the new holder's, which reads them from the last commit.
        const held = this.heldPartitions();
        if (held) records = records.filter((m) => held.has(`${m.topic}:${m.partition}`));
        // Below what the group committed when this member last joined: handled (by another member
        // meanwhile), so neither handed again nor committed behind it.
        await this.takeFloors();
        records = records.filter((m) => m.offset >= (this.floors.get(`${m.topic}:${m.partition}`) ?? -1n));
        if (records.length === 0) return records;
        await this.options.handler({ topic: this.log.unprefix(topic), records: this.delivered(records) });
        return records;
      } catch (err) {
        if (this.closing) return null;
        if (this.consumerFailed) throw new HandlerFailed(err);
        this.report(err);
      }
      await this.sleeper.sleep(backoffMs(this.log.settings.retryBackoffMs, failures));
      if (this.closing) return null;
    }
  }

  /** Once per join, takes the group's committed offsets of the partitions held as `floors`. */
  private async takeFloors(): Promise<void> {
    // A join while they are listed has them listed again.
    while (this.floorsOf !== this.joins) await this.takeFloorsOnce();
  }

  private async takeFloorsOnce(): Promise<void> {
    const joins = this.joins;
    const assignments = this.consumer?.assignments;
    if (!assignments) {
      this.floors = new Map();
      this.floorsOf = joins;
      return;
    }
    const committed =
      assignments.length === 0
        ? new Map<string, bigint[]>()
        : await withTimeout(
            this.consumer!.listCommittedOffsets({
              topics: assignments.map((a) => ({ topic: a.topic, partitions: a.partitions })),
            }),
            this.log.settings.requestTimeoutMs,
            'listing committed offsets timed out',
          );
    const floors = new Map<string, bigint>();
    for (const { topic, partitions } of assignments) {
      for (const partition of partitions) {
        const offset = committed.get(topic)?.[partition] ?? -1n;
        if (offset >= 0n) floors.set(`${topic}:${partition}`, offset);
      }
    }
    this.floors = floors;
    this.floorsOf = joins;
  }

  /** `topic:partition` of each partition the consumer holds now; null when it cannot tell. */
  private heldPartitions(): Set<string> | null {
    const assignments = this.consumer?.assignments;
    if (!assignments) return null;
    return new Set(assignments.flatMap((a) => a.partitions.map((p) => `${a.topic}:${p}`)));
  }

  private delivered(records: StringMessage[]): DeliveredRecord[] {
    const out = new Array<DeliveredRecord>(records.length);
    for (let i = 0; i < records.length; i++) {
      const m = records[i]!;
      out[i] = {
        topic: this.log.unprefix(m.topic),
        partition: m.partition,
        offset: m.offset,
        key: m.key ?? '',
        value: m.value ?? '',
        timestamp: Number(m.timestamp),
      };
    }
    return out;
  }

  /** Commits past `last`: the last handled record of each partition. */
  private async commit(last: StringMessage[]): Promise<void> {
    // Only for partitions still held: the broker takes a member's commit for any partition, and
    // one for a partition now read by another member would move that member's position.
    const held = this.heldPartitions();
    const mine = held ? last.filter((m) => held.has(`${m.topic}:${m.partition}`)) : last;
    if (mine.length === 0) return;
    const offsets = mine.map((m) => ({
      topic: m.topic,
      partition: m.partition,
      offset: m.offset + 1n,
      leaderEpoch: m.leaderEpoch,
    }));
    await withTimeout(
      this.consumer!.commit({ offsets }),
      this.log.settings.requestTimeoutMs * 2,
      () => new CommitTimedOut('commit timed out'),
    );
  }

  private async teardown(consumerToo: boolean): Promise<void> {
    const reader = this.reader;
    this.reader = undefined;
    if (reader) {
      await withTimeout(reader.close(), 5_000, 'closing the stream timed out').catch(() => undefined);
    }
    if (!consumerToo) return;
    const consumer = this.consumer;
    this.consumer = undefined;
    if (consumer) {
      await withTimeout(
        consumer.close(true),
        this.log.settings.requestTimeoutMs,
        'closing the consumer timed out',
      ).catch(() => undefined);
    }
  }

  private report(err: unknown): void {
    try {
      this.options.onError?.(err);
    } catch {
      // A failing error reporter must not stop the subscription.
    }
  }
}

/** Pulls batches out of a paused `MessagesStream`, waking on data, errors and interruptions. */
class StreamReader {
  private error: Error | undefined;
  private ended = false;
  private offsetsFixed = false;
  private notify: (() => void) | undefined;
  private interrupted = false;
  private woken = false;

  constructor(private readonly stream: StringStream) {
    stream.on('readable', () => this.poke());
    stream.on('offsets', () => {
      this.offsetsFixed = true;
      this.poke();
    });
    stream.on('error', (err: Error) => this.fail(err));
    stream.on('end', () => this.end());
    stream.on('close', () => this.end());
  }

  fail(err: unknown): void {
    this.error ??= err instanceof Error ? err : new Error(String(err));
    this.poke();
  }

  interrupt(): void {
    this.interrupted = true;
    this.poke();
  }

  /** Ends the wait of `next` for a first record early, once (now, or in its next call). */
  wake(): void {
    this.woken = true;
    this.poke();
  }

  async positioned(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!this.offsetsFixed) {
      this.check();
      const left = deadline - Date.now();
      if (left <= 0) throw new Error('the consumer did not find its starting offsets in time');
      await this.wait(left);
    }
  }

  /**
   * Up to `max` messages; waits at most `maxWaitMs` once the first one is there, and at most
   * `idleMs` (when given) for the first one. Empty when interrupted, woken or idle that long.
   */
  async next(max: number, maxWaitMs: number, idleMs?: number): Promise<StringMessage[]> {
    const batch: StringMessage[] = [];
    let deadline = 0;
    const idleUntil = idleMs === undefined ? undefined : Date.now() + idleMs;
    while (batch.length < max) {
      if (this.interrupted) return [];
      if (this.woken && batch.length === 0) {
        this.woken = false;
        return [];
      }
      const message = this.stream.read() as StringMessage | null;
      if (message !== null) {
        if (batch.length === 0) deadline = Date.now() + maxWaitMs;
        batch.push(message);
        continue;
      }
      this.check();
      if (batch.length > 0) {
        const left = deadline - Date.now();
        if (left <= 0) break;
        await this.wait(left);
      } else if (idleUntil !== undefined) {
        const left = idleUntil - Date.now();
        if (left <= 0) break;
        await this.wait(left);
      } else {
        await this.wait(undefined);
      }
    }
    return batch;
  }

  async close(): Promise<void> {
    this.interrupt();
    if (!this.stream.destroyed) await this.stream.close();
  }

  private check(): void {
    if (this.error !== undefined) throw this.error;
    if (this.ended) throw new Error('the message stream ended');
  }

  private end(): void {
    this.ended = true;
    this.poke();
  }

  private poke(): void {
    const n = this.notify;
    this.notify = undefined;
    n?.();
  }

  private wait(ms: number | undefined): Promise<void> {
    if (this.interrupted || this.error !== undefined || this.ended) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = ms === undefined ? undefined : setTimeout(() => this.poke(), ms);
      this.notify = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
}

/** Back-off sleeps that `stop` cuts short, now and for good. */
class Sleeper {
  private wakeUp: (() => void) | undefined;
  private stopped = false;

  sleep(ms: number): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const finish = (): void => {
        clearTimeout(timer);
        this.wakeUp = undefined;
        resolve();
      };
      const timer = setTimeout(finish, ms);
      this.wakeUp = finish;
    });
  }

  stop(): void {
    this.stopped = true;
    this.wakeUp?.();
  }
}

function groupByTopic(messages: StringMessage[]): Map<string, StringMessage[]> {
  const byTopic = new Map<string, StringMessage[]>();
  for (const m of messages) {
    const list = byTopic.get(m.topic);
    if (list) list.push(m);
    else byTopic.set(m.topic, [m]);
  }
  return byTopic;
}

interface ClientError {
  apiId?: string;
  errors?: unknown[];
}

/** True when the error, or every error it aggregates, satisfies `test`. */
function everyError(err: unknown, test: (e: ClientError) => boolean): boolean {
  const e = err as ClientError | null;
  if (!e || typeof e !== 'object') return false;
  if (Array.isArray(e.errors) && e.errors.length > 0)
    return e.errors.every((inner) => everyError(inner, test));
  return test(e);
}

function withTimeout<T>(promise: Promise<T>, ms: number, failure: string | (() => Error)): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(typeof failure === 'string' ? new Error(failure) : failure()), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
