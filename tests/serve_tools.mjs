// serve_tools.mjs - tool calls of `jlm serve` through the official `openai`
// npm client (tests/test_serve.c: the serve/tool_calls_* tests).
// usage: node serve_tools.mjs NODE_MODULES BASE_URL MODEL fixed CASES_JSON I[,I...]
//        node serve_tools.mjs NODE_MODULES BASE_URL MODEL forced SEEDS
// fixed: each case's output (tests/toolcall/cases.json) is forced with a
//   `grammar` that allows only that text, so the server parses a fixed model
//   output; the reply, whole and streamed (the client's own assembly of the
//   deltas: chat.completions.stream(...).finalChatCompletion()), must carry
//   the case's content and tool_calls.
// forced: tool_choice "required" and a named function, seeds 1..SEEDS,
//   whole and streamed: always exactly one call the client parses, of an
//   allowed tool, its arguments JSON holding the schema's required keys.
// Prints "ok N" (N replies checked) or the first mismatch; exit 1 on a
// mismatch, 3 when the package cannot be loaded (the test skips).
import assert from 'node:assert/strict';
import { openaiClient } from './openai_client.mjs';
import { checkForcedArgs, gbnfLiteral, report, selectedCases } from './node_client.mjs';

const [modules, baseURL, model, mode, ...rest] = process.argv.slice(2);
const client = openaiClient(modules, baseURL, 120000);

const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } },
    { type: 'function', function: { name: 'get_time', description: 'The time in a zone',
        parameters: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris, and the time?' }];

// Both ways: the whole completion and the client's assembly of the stream.
async function both(body) {
    const whole = await client.chat.completions.create(body);
    const stream = client.chat.completions.stream({ ...body, stream: true });
    const assembled = await stream.finalChatCompletion();
    return [['whole', whole.choices[0]], ['stream', assembled.choices[0]]];
}

let checked = 0;
await report(async () => {
    if (mode === 'fixed') {
        for (const [i, c] of selectedCases(rest[0], rest[1])) {
            const body = { model, messages, tools, max_tokens: 600, temperature: 1, seed: i,
                           grammar: 'root ::= ' + gbnfLiteral(c.output) };
            for (const [how, ch] of await both(body)) {
                const where = `case ${i} (${c.family}) ${how}`;
                const calls = ch.message.tool_calls ?? [];
                assert.equal(calls.length, c.tool_calls.length, `${where}: ${JSON.stringify(ch.message)}`);
                calls.forEach((got, k) => {
                    assert.equal(got.type, 'function', where);
                    assert.ok(typeof got.id === 'string' && got.id.length > 0, `${where}: id`);
                    assert.equal(got.function.name, c.tool_calls[k].name, where);
                    assert.deepEqual(JSON.parse(got.function.arguments), JSON.parse(c.tool_calls[k].arguments), where);
                });
                assert.equal(new Set(calls.map(x => x.id)).size, calls.length, `${where}: distinct ids`);
                assert.equal(ch.message.content ?? null, c.content ?? (calls.length ? null : ''), `${where}: content`);
                assert.equal(ch.finish_reason, calls.length ? 'tool_calls' : 'stop', `${where}: finish_reason`);
                checked++;
            }
        }
    } else if (mode === 'forced') {
        const seeds = Number(rest[0]);
        const choices = ['required', { type: 'function', function: { name: 'get_time' } },
                         { type: 'function', function: { name: 'get_weather' } }];
        for (let seed = 1; seed <= seeds; seed++)
            for (const tool_choice of choices) {
                const body = { model, messages, tools, tool_choice, max_tokens: 120, temperature: 1.5, seed };
                for (const [how, ch] of await both(body)) {
                    const where = `seed ${seed} ${JSON.stringify(tool_choice)} ${how}`;
                    const calls = ch.message.tool_calls ?? [];
                    assert.equal(ch.finish_reason, 'tool_calls', `${where}: ${JSON.stringify(ch)}`);
                    assert.equal(calls.length, 1, where);
                    const name = calls[0].function.name;
                    if (typeof tool_choice === 'object') assert.equal(name, tool_choice.function.name, where);
                    const tool = tools.find(t => t.function.name === name);
                    checkForcedArgs(where, name, JSON.parse(calls[0].function.arguments), tool?.function.parameters);
                    checked++;
                }
            }
    } else {
        throw new Error(`unknown mode ${mode}`);
    }
    return checked;
});
