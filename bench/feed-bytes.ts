/**
 * What writing a signed-in viewer's feed page costs the process, two ways: the page written anew with
 * the viewer's flags (`feedResponseBytes`: its template made, then filled, as for pages that are not
 * kept), and the kept page's template filled with them (`fillFeedTemplate`, what the feed service
 * does for the public feed). A page of 20 posts shaped like the benchmark's
 * (Chinese title and description, one presigned image URL, the author's nickname), 1 in 7 flags set;
 * each way runs in turn, FEED_BYTES_ROUNDS times (5) of FEED_BYTES_PAGES pages (50,000).
 *
 *   npx tsx bench/feed-bytes.ts
 */
import type { PostView } from '../src/knowpost/post-read.model.js';
import type { AuthorRow } from '../src/knowpost/post-read.repository.js';
import {
  feedResponseBytes,
  feedTemplate,
  fillFeedTemplate,
  type FeedPage,
} from '../src/knowpost/read-answers.js';

const rounds = Number(process.env.FEED_BYTES_ROUNDS ?? 5);
const pages = Number(process.env.FEED_BYTES_PAGES ?? 50_000);

const author: AuthorRow = {
  id: 5,
  nickname: '知光作者',
  avatar: 'https://files.test/avatars/5.png',
  tagsJson: '["读书"]',
};
const posts: PostView[] = Array.from({ length: 20 }, (_, i) => ({
  id: String(7_300_000_000_000_000_000n + BigInt(i)),
  authorId: 5,
  status: 'published',
  visible: 'public',
  title: `第 ${i} 篇：关于知识分享的一些想法`,
  description: '这是一段用来测试的描述，长度和真实的帖子差不多。'.repeat(3),
  tags: ['读书', '技术'],
  imgUrls: [`posts/${i}/images/cover.png`],
  contentKey: `posts/${i}/content.md`,
  isTop: false,
  type: 'image_text',
  publishTime: Date.now(),
  contentUrl: null,
  images: [
    `https://files.test/zhiguang/posts/${i}/images/cover.png?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=${'A'.repeat(280)}`,
  ],
  urlsExpireAt: Date.now() + 3_600_000,
}));
const page: FeedPage = {
  entries: posts.map((post, i) => ({
    post,
    author,
    counts: [0, i * 3, i, 0, 0],
    flags: { like: false, fav: false },
  })),
  page: 1,
  size: 20,
  hasMore: true,
};
const template = feedTemplate(page);
const NO_FLAGS = { like: false, fav: false };
const flagsOf = (k: number) =>
  new Map(posts.map((p, i) => [p.id, { like: (i + k) % 7 === 0, fav: (i + k) % 11 === 0 }]));

const ways = {
  written: (k: number) => {
    const known = flagsOf(k);
    return feedResponseBytes({
      ...page,
      entries: page.entries.map((e) => ({ ...e, flags: known.get(e.post.id) ?? NO_FLAGS })),
    });
  },
  template: (k: number) => {
    const known = flagsOf(k);
    return fillFeedTemplate(template, (i) => known.get(page.entries[i]!.post.id) ?? NO_FLAGS);
  },
};
if (!ways.written(3).equals(ways.template(3))) throw new Error('the two ways wrote different answers');

const results: Record<string, number[]> = { written: [], template: [] };
for (let round = 0; round < rounds; round++) {
  for (const [name, write] of Object.entries(ways)) {
    const start = performance.now();
    for (let k = 0; k < pages; k++) write(k);
    results[name]!.push(((performance.now() - start) * 1000) / pages);
  }
}
console.log(
  `signed-in feed page of 20, ${ways.written(0).length} bytes, µs per page over ${rounds} rounds of ${pages}:`,
);
for (const [name, us] of Object.entries(results))
  console.log(`  ${name.padEnd(8)} ${us.map((u) => u.toFixed(2)).join(' / ')}`);
