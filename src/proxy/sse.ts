// Reading the decoder's SSE stream just enough to time the first token: the first event that
// carries generated text (not a role-only chat chunk).

/** True when a parsed SSE payload carries generated text (completion `text`, chat `delta.content`). */
function hasContent(ev: unknown): boolean {
  const choices = (ev as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices)) return false;
  for (const c of choices as { text?: unknown; delta?: { content?: unknown; tool_calls?: unknown } }[]) {
    if (typeof c?.text === 'string' && c.text.length > 0) return true;
    const d = c?.delta;
    if (d && ((typeof d.content === 'string' && d.content.length > 0) || (Array.isArray(d.tool_calls) && d.tool_calls.length > 0))) return true;
  }
  return false;
}

/** Could this event's text carry a token? A cheap filter before JSON.parse. */
const MAYBE_CONTENT = /"(?:text|content)"\s*:\s*"(?!")|"tool_calls"/;

/** Parses one SSE event (without its blank line) and tells whether it carries generated text. */
function eventHasContent(event: string): boolean {
  if (!MAYBE_CONTENT.test(event)) return false;
  let data = '';
  for (const line of event.split(/\r?\n/)) {
    if (line.startsWith('data:')) data += (data ? '\n' : '') + line.slice(line.startsWith('data: ') ? 6 : 5);
  }
  if (!data || data === '[DONE]') return false;
  try {
    return hasContent(JSON.parse(data));
  } catch {
    return false; // not JSON: not a token
  }
}

/**
 * Finds the first SSE event of a stream that carries generated text, so the time to first
 * token is not taken at a role-only chat chunk (`delta: {role, content: ""}`). Fed the raw
 * pieces until it answers true; it looks at whole events only (an event split across pieces
 * waits for its end), decodes just those bytes and is not used after that, so its cost stays
 * on the first event or two.
 */
export class FirstContent {
  private pending: Buffer | null = null;

  feed(piece: Buffer): boolean {
    const buf = this.pending ? Buffer.concat([this.pending, piece]) : piece;
    let from = 0;
    for (;;) {
      // An event ends at a blank line: "\n\n" (or "\n\r\n" with CRLF line ends).
      let end = buf.indexOf('\n\n', from);
      let sep = 2;
      if (end < 0) {
        end = buf.indexOf('\n\r\n', from);
        sep = 3;
      }
      if (end < 0) {
        this.pending = from < buf.length ? buf.subarray(from) : null;
        return false;
      }
      if (eventHasContent(buf.toString('utf8', from, end))) {
        this.pending = null;
        return true;
      }
      from = end + sep;
    }
  }
}
