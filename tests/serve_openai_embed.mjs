// serve_openai_embed.mjs - `jlm serve`'s /v1/embeddings through the official
// `openai` npm client (tests/test_serve.c, suite serve_apis), which asks for base64 and
// decodes it, and once more with encoding_format "float".
// usage: node serve_openai_embed.mjs NODE_MODULES BASE_URL MODEL TEXT
// Prints {b64: [[...]], float: [[...]], usage}. Exit 3 without the package.
import { loadPackage } from './node_client.mjs';

const [modules, baseURL, model, text] = process.argv.slice(2);
const m = loadPackage(modules, 'openai');
const OpenAI = m.default ?? m;
const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
const a = await client.embeddings.create({ model, input: [text, 'Hello there'] });
const b = await client.embeddings.create({ model, input: text, encoding_format: 'float' });
console.log(JSON.stringify({ b64: a.data.map((d) => Array.from(d.embedding)), float: b.data.map((d) => d.embedding),
                             usage: a.usage }));
