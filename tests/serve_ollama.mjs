// serve_ollama.mjs - drives `jlm serve`'s /api/... with the official
// `ollama` npm client (tests/test_serve.c, suite serve_apis).
// usage: node serve_ollama.mjs NODE_MODULES HOST MODEL PROMPT MAX_TOKENS
// Prints one JSON object: {tags, ps, show, chat, chat_stream, generate,
// generate_stream, done_reason, eval_count, embed, refused}. Exit 3 when the
// package cannot be loaded (the test skips).
import { loadPackage } from './node_client.mjs';

const [modules, host, model, prompt, maxTokens] = process.argv.slice(2);
const m = loadPackage(modules, 'ollama');
const Ollama = m.Ollama ?? m.default.Ollama;

const client = new Ollama({ host });
const options = { temperature: 0, num_predict: Number(maxTokens) };
const messages = [{ role: 'user', content: 'Hello there' }];
const out = {};

out.tags = (await client.list()).models.map((m) => m.name);
out.ps = (await client.ps()).models.map((m) => m.name);
const sh = await client.show({ model: `${model}:latest` });
out.show = { family: sh.details.family, has_template: typeof sh.template === 'string' };

const c = await client.chat({ model: `${model}:latest`, messages, options, stream: false });
out.chat = c.message.content;
out.done_reason = c.done_reason;
out.eval_count = c.eval_count;
out.prompt_eval_count = c.prompt_eval_count;

let s = '';
let last = null;
for await (const part of await client.chat({ model, messages, options, stream: true })) {
    s += part.message.content;
    last = part;
}
out.chat_stream = s;
out.stream_done = last?.done;

const g = await client.generate({ model, prompt, raw: true, options, stream: false });
out.generate = g.response;
let gs = '';
for await (const part of await client.generate({ model, prompt, raw: true, options, stream: true })) gs += part.response;
out.generate_stream = gs;

const e = await client.embed({ model, input: [prompt, 'Hello there'] });
out.embed = e.embeddings;

try {
    await client.chat({ model, messages, options: { mirostat: 2 }, stream: false });
    out.refused = null;
} catch (err) {
    out.refused = { status: err.status_code, error: err.error };
}
console.log(JSON.stringify(out));
