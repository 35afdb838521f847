// serve_openai.mjs - drives `jlm serve` with the official `openai` npm client
// (tests/test_serve.c: serve/the_openai_npm_client_gets_what_jlm_run_gives).
// usage: node serve_openai.mjs NODE_MODULES BASE_URL MODEL PROMPT MAX_TOKENS
// Prints one JSON object: {models, completion, stream, chat, chat_stream,
// finish, usage, n2, n2_stream (the texts of n = 2 choices, seed 7, by index)}. Exit 3 when the package cannot be loaded (the test skips).
import { openaiClient } from './openai_client.mjs';

const [modules, baseURL, model, prompt, maxTokens] = process.argv.slice(2);
const client = openaiClient(modules, baseURL, 60000);
const n = Number(maxTokens);
const out = {};

const list = await client.models.list();
out.models = [];
for await (const m of list) out.models.push(m.id);

const c = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0 });
out.completion = c.choices[0].text;
out.finish = c.choices[0].finish_reason;
out.usage = c.usage;

let s = '';
for await (const ch of await client.completions.create({ model, prompt, max_tokens: n, temperature: 0, stream: true }))
    s += ch.choices[0]?.text ?? '';
out.stream = s;

const messages = [{ role: 'user', content: 'Hello there' }];
const cc = await client.chat.completions.create({ model, messages, max_tokens: n, temperature: 0 });
out.chat = cc.choices[0].message.content;

let cs = '';
for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: n, temperature: 0, stream: true }))
    cs += ch.choices[0]?.delta?.content ?? '';
out.chat_stream = cs;

const n2 = await client.completions.create({ model, prompt, max_tokens: n, temperature: 1.0, seed: 7, n: 2 });
out.n2 = [];
for (const ch of n2.choices) out.n2[ch.index] = ch.text;
out.n2_stream = ['', ''];
for await (const ch of await client.completions.create({ model, prompt, max_tokens: n, temperature: 1.0, seed: 7, n: 2, stream: true }))
    for (const c of ch.choices) out.n2_stream[c.index] += c.text ?? '';

console.log(JSON.stringify(out));
