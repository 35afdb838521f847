// serve_anthropic.mjs - drives `jlm serve`'s /v1/messages with the official
// `@anthropic-ai/sdk` npm client (tests/test_serve.c, suite serve_apis).
// usage: node serve_anthropic.mjs NODE_MODULES BASE_URL MODEL MAX_TOKENS
// Prints one JSON object: {message, stop_reason, usage, stream, events,
// final, refused}. Exit 3 when the package cannot be loaded (the test skips).
import { loadPackage } from './node_client.mjs';

const [modules, baseURL, model, maxTokens] = process.argv.slice(2);
const pkg = loadPackage(modules, '@anthropic-ai/sdk');
const Anthropic = pkg.default ?? pkg.Anthropic ?? pkg;

const client = new Anthropic({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
const max_tokens = Number(maxTokens);
const messages = [{ role: 'user', content: 'Hello there' }];
const out = {};

const m = await client.messages.create({ model, max_tokens, messages, temperature: 0 });
out.message = m.content.map((b) => b.text).join('');
out.stop_reason = m.stop_reason;
out.usage = m.usage;
out.role = m.role;

const stream = client.messages.stream({ model, max_tokens, messages, temperature: 0 });
out.events = [];
let s = '';
for await (const ev of stream) {
    out.events.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') s += ev.delta.text;
}
out.stream = s;
const fin = await stream.finalMessage();
out.final = { text: fin.content.map((b) => b.text).join(''), stop_reason: fin.stop_reason, usage: fin.usage };

try {
    await client.messages.create({ model, max_tokens, messages: [{ role: 'user', content: [
        { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
    out.refused = null;
} catch (e) {
    out.refused = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message };
}
console.log(JSON.stringify(out));
