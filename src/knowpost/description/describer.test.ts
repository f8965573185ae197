import { describe, expect, it } from 'vitest';
import { analysedPart, withoutHiddenHtml } from './describer.js';

describe(withoutHiddenHtml.name, () => {
  it('drops script and style blocks, to their closing line or to the end', () => {
    const post = [
      'Before.',
      '<script>',
      "fetch('/steal')",
      '</script>',
      '  <STYLE media="x">body { color: red }</style> After the style.',
      'Middle.',
      '<script src="x.js">',
      'never closed',
    ].join('\n');
    expect(withoutHiddenHtml(post).split('\n')).toEqual([
      'Before.',
      '',
      '',
      '',
      ' After the style.',
      'Middle.',
      '',
      '',
    ]);
  });

  it('drops elements closed within a line, but not tags named in code or left open mid-line', () => {
    expect(withoutHiddenHtml('a <script>x()</script> b <style>p{}</style> c')).toBe('a   b   c');
    expect(withoutHiddenHtml('Load it with a `<script>` tag, then </script> later.')).toBe(
      'Load it with a `<script>` tag, then </script> later.',
    );
    expect(withoutHiddenHtml('Put <script> in the head.')).toBe('Put <script> in the head.');
    expect(withoutHiddenHtml('<scripts> and <styles> are not tags')).toBe(
      '<scripts> and <styles> are not tags',
    );
  });

  it('keeps fenced code, which shows as text', () => {
    const post = ['```html', '<script>', 'alert(1)', '</script>', '```', 'Text.'].join('\n');
    expect(withoutHiddenHtml(post)).toBe(post);
  });

  it('is linear in its input', () => {
    const started = performance.now();
    for (const unit of ['<script', '<script>', '`<script>', '<style></style', '\n<script>']) {
      withoutHiddenHtml(unit.repeat(200_000 / unit.length));
    }
    expect(performance.now() - started).toBeLessThan(1_000);
  });
});

describe(analysedPart.name, () => {
  it('ends the opening at a line break when that keeps a few sentences, else within the line', () => {
    const paragraph = '计数器'.repeat(10_000);
    // A short heading and one long paragraph: read into the paragraph, not as the heading alone.
    const headed = analysedPart(`# 笔记\n${paragraph}`, 1_000);
    expect(headed.length).toBe(1_000);
    expect(headed.startsWith('# 笔记\n计数器')).toBe(true);
    const lines = `${'一行文字。'.repeat(50)}\n${paragraph}`;
    expect(analysedPart(lines, 1_000)).toBe('一行文字。'.repeat(50));
    // Never half a surrogate pair.
    expect(analysedPart(`# tt\n${'😀'.repeat(1_000)}`, 1_000)).toBe(`# tt\n${'😀'.repeat(497)}`);
  });
});
