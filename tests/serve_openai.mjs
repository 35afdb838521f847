// serve_openai.mjs - drives `jlm serve` with the official `openai` npm client
// (tests/test_serve.c: serve/the_openai_npm_client_gets_what_jlm_run_gives).
// usage: node serve_openai.mjs NODE_MODULES BASE_URL MODEL PROMPT MAX_TOKENS
// Prints one JSON object: {models, completion, stream, chat, chat_stream,
// finish, usage}. Exit 3 when the package cannot be loaded (the test skips).
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

console.log(JSON.stringify(out));
