// The chat message shape shared by /v1/chat/completions and /tokenize ({messages}).
import { z } from 'zod';

const textPart = z.strictObject({ type: z.literal('text', 'only text content parts are supported'), text: z.string('expected a string') });

// Strict: a message field this engine would not use (tool calls, audio, …) is a 400 naming it.
export const chatMessage = z.strictObject({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool'], 'expected one of system, developer, user, assistant, tool'),
  content: z.union([z.string(), z.array(textPart)], 'expected a string or an array of text parts').nullish(),
  name: z.string('expected a string').optional(),
  tool_calls: z.array(z.unknown()).max(0, 'tools (function calling) are not supported by this engine').nullish(),
});
export type ChatMessageBody = z.infer<typeof chatMessage>;

export const chatMessages = z.array(chatMessage, 'expected an array of messages').min(1, 'expected at least one message');

/** Flattens a message's content (string or text parts) into the template's string form. */
export function messageText(m: ChatMessageBody): string {
  if (m.content === null || m.content === undefined) return '';
  if (typeof m.content === 'string') return m.content;
  return m.content.map((p) => p.text).join('');
}
