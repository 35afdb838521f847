// openai_client.mjs - the official `openai` npm client for the node scripts
// that drive `jlm serve` (serve_openai.mjs, serve_tools.mjs): loaded from
// NODE_MODULES, exit 3 when it cannot be (the test skips).
import { createRequire } from 'node:module';
import path from 'node:path';

export function openaiClient(modules, baseURL, timeout) {
    let OpenAI;
    try {
        const require = createRequire(path.join(modules, 'x.js'));
        OpenAI = require('openai').default ?? require('openai');
    } catch (e) {
        console.error(`openai package not found under ${modules}: ${e.message}`);
        process.exit(3);
    }
    return new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout });
}
