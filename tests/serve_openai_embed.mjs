// serve_openai_embed.mjs - `jlm serve`'s /v1/embeddings through the official
// `openai` npm client (tests/test_serve_apis.c), which asks for base64 and
// decodes it, and once more with encoding_format "float".
// usage: node serve_openai_embed.mjs NODE_MODULES BASE_URL MODEL TEXT
// Prints {b64: [[...]], float: [[...]], usage}. Exit 3 without the package.
import { createRequire } from 'node:module';
import path from 'node:path';

const [modules, baseURL, model, text] = process.argv.slice(2);
let OpenAI;
try {
    const require = createRequire(path.join(modules, 'x.js'));
    OpenAI = require('openai').default ?? require('openai');
} catch (e) {
    console.error(`openai package not found under ${modules}: ${e.message}`);
    process.exit(3);
}
const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
const a = await client.embeddings.create({ model, input: [text, 'Hello there'] });
const b = await client.embeddings.create({ model, input: text, encoding_format: 'float' });
console.log(JSON.stringify({ b64: a.data.map((d) => Array.from(d.embedding)), float: b.data.map((d) => d.embedding),
                             usage: a.usage }));
