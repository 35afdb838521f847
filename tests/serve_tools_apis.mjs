// serve_tools_apis.mjs - tool use of `jlm serve` through Anthropic's
// /v1/messages and ollama's /api/chat with their official npm clients
// (`@anthropic-ai/sdk`, `ollama`; tests/test_serve.c, suite serve_apis).
// usage: node serve_tools_apis.mjs NODE_MODULES ORIGIN MODEL fixed CASES_JSON I[,I...]
//        node serve_tools_apis.mjs NODE_MODULES ORIGIN MODEL forced SEEDS
// fixed: each case's output (tests/toolcall/cases.json) is forced with a
//   `grammar` that allows only that text; Anthropic's reply, whole and
//   assembled by the SDK from the stream (messages.stream().finalMessage()),
//   must carry the case's text and tool_use blocks; ollama's chat reply,
//   whole and streamed (the objects the client yields), its content and
//   message.tool_calls.
// forced: Anthropic's tool_choice {type: any} and {type: tool, name}, SEEDS
//   rounds (Anthropic has no seed: each request samples anew), whole and
//   streamed: always exactly one tool_use of an allowed tool whose input
//   holds the schema's required keys.
// Prints "ok N" (N replies checked) or the first mismatch; exit 1 on a
// mismatch, 3 when a package cannot be loaded (the test skips).
import assert from 'node:assert/strict';
import { checkForcedArgs, gbnfLiteral, loadPackage, report, selectedCases } from './node_client.mjs';

const [modules, origin, model, mode, ...rest] = process.argv.slice(2);
const an = loadPackage(modules, '@anthropic-ai/sdk');
const Anthropic = an.default ?? an.Anthropic ?? an;
const ol = loadPackage(modules, 'ollama');
const Ollama = ol.Ollama ?? ol.default.Ollama;
const anthropic = new Anthropic({ baseURL: origin, apiKey: 'test-key', maxRetries: 0, timeout: 120000 });
const ollama = new Ollama({ host: origin });

const schemas = {
    get_weather: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
    get_time: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] },
};
const antTools = Object.entries(schemas).map(([name, input_schema]) => ({ name, description: `the tool ${name}`, input_schema }));
const olTools = Object.entries(schemas).map(([name, parameters]) => ({ type: 'function',
    function: { name, description: `the tool ${name}`, parameters } }));
const question = 'What is the weather in Paris, and the time?';

async function anthropicBoth(body) {
    const whole = await anthropic.messages.create(body);
    const assembled = await anthropic.messages.stream(body).finalMessage();
    return [['whole', whole], ['stream', assembled]];
}

async function ollamaBoth(body) {
    const whole = (await ollama.chat({ ...body, stream: false })).message;
    const msg = { content: '', tool_calls: [] };
    for await (const part of await ollama.chat({ ...body, stream: true })) {
        msg.content += part.message?.content ?? '';
        msg.tool_calls.push(...(part.message?.tool_calls ?? []));
    }
    return [['whole', { content: whole.content, tool_calls: whole.tool_calls ?? [] }], ['stream', msg]];
}

let checked = 0;
await report(async () => {
    if (mode === 'fixed') {
        for (const [i, c] of selectedCases(rest[0], rest[1])) {
            const grammar = 'root ::= ' + gbnfLiteral(c.output);
            const want = c.tool_calls.map(t => ({ name: t.name, input: JSON.parse(t.arguments) }));
            const body = { model, max_tokens: 600, temperature: 1, tools: antTools, grammar,
                           messages: [{ role: 'user', content: question }] };
            for (const [how, m] of await anthropicBoth(body)) {
                const where = `anthropic case ${i} (${c.family}) ${how}: ${JSON.stringify(m.content)}`;
                const uses = m.content.filter(b => b.type === 'tool_use');
                assert.deepEqual(uses.map(b => ({ name: b.name, input: b.input })), want, where);
                assert.ok(uses.every(b => /^toolu_[A-Za-z0-9]+$/.test(b.id)), `${where}: ids`);
                assert.equal(new Set(uses.map(b => b.id)).size, uses.length, `${where}: distinct ids`);
                const text = m.content.filter(b => b.type === 'text').map(b => b.text).join('');
                assert.equal(text, c.content ?? '', `${where}: text`);
                assert.equal(m.stop_reason, uses.length ? 'tool_use' : 'end_turn', `${where}: stop_reason`);
                checked++;
            }
            const obody = { model: `${model}:latest`, tools: olTools, grammar,
                            options: { temperature: 1, num_predict: 600 },
                            messages: [{ role: 'user', content: question }] };
            for (const [how, m] of await ollamaBoth(obody)) {
                const where = `ollama case ${i} (${c.family}) ${how}: ${JSON.stringify(m)}`;
                assert.deepEqual(m.tool_calls.map(t => ({ name: t.function.name, input: t.function.arguments })), want, where);
                assert.equal(m.content, c.content ?? '', `${where}: content`);
                checked++;
            }
        }
    } else if (mode === 'forced') {
        const seeds = Number(rest[0]);
        const choices = [{ type: 'any' }, { type: 'tool', name: 'get_time' }, { type: 'tool', name: 'get_weather' }];
        for (let seed = 1; seed <= seeds; seed++)
            for (const tool_choice of choices) {
                const body = { model, max_tokens: 120, temperature: 1, tools: antTools, tool_choice,
                               messages: [{ role: 'user', content: question }] };
                for (const [how, m] of await anthropicBoth(body)) {
                    const where = `seed ${seed} ${JSON.stringify(tool_choice)} ${how}: ${JSON.stringify(m.content)}`;
                    const uses = m.content.filter(b => b.type === 'tool_use');
                    assert.equal(m.stop_reason, 'tool_use', where);
                    assert.equal(uses.length, 1, where);
                    const name = uses[0].name;
                    if (tool_choice.name) assert.equal(name, tool_choice.name, where);
                    checkForcedArgs(where, name, uses[0].input, schemas[name]);
                    checked++;
                }
            }
    } else {
        throw new Error(`unknown mode ${mode}`);
    }
    return checked;
});
