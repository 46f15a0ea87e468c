// Drives one Node client against Pharos, one call after another, and prints what the client
// returned as one JSON object (read by tests/component/test_clients.py).
//
//   node drive.mjs openai|ollama BASE_URL KEY
//
// The same calls as the Python drivers of the same API, so captures compare across languages.
import OpenAI from "openai";
import { Ollama } from "ollama";

const [client, base, key] = process.argv.slice(2);
const LLAMA = "llama3.2:3b";
const hello = [{ role: "user", content: "Hello" }];
const NEXT = "And then? Grüße, 你好"; // as the Python drivers: shows how non-ASCII text is sent

async function errorOf(call) {
  try {
    await call();
    return null;
  } catch (e) {
    return { status: e.status ?? e.status_code ?? null, code: e.code ?? null,
             message: String(e.error?.message ?? e.error ?? e.message) };
  }
}

async function openai() {
  const api = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0 });
  const out = {};
  out.models = [];
  for await (const m of api.models.list()) out.models.push(m.id);
  const plain = await api.chat.completions.create({ model: LLAMA, messages: hello,
                                                    max_tokens: 5 });
  out.plain = { content: plain.choices[0].message.content, usage: plain.usage };
  const chunks = [];
  for await (const c of await api.chat.completions.create({
    model: LLAMA, messages: hello, max_tokens: 5, stream: true })) chunks.push(c);
  out.stream = { text: chunks.map((c) => c.choices[0]?.delta?.content ?? "").join(""),
                 usage_chunks: chunks.filter((c) => c.usage).length };
  const withUsage = [];
  for await (const c of await api.chat.completions.create({
    model: LLAMA, messages: hello, max_tokens: 5, stream: true,
    stream_options: { include_usage: true } })) withUsage.push(c);
  out.stream_usage = withUsage.at(-1).usage;
  const turn2 = [...hello, { role: "assistant", content: plain.choices[0].message.content },
                 { role: "user", content: NEXT }];
  const second = await api.chat.completions.create({ model: LLAMA, messages: turn2,
                                                     max_tokens: 5 });
  out.turn2 = second.choices[0].message.content;
  const completion = await api.completions.create({ model: LLAMA, prompt: "Once upon",
                                                    max_tokens: 5 });
  out.completion = completion.choices[0].text;
  const resp = await api.responses.create({ model: "tiny", input: "Hello",
                                            max_output_tokens: 16 });
  out.responses = { text: resp.output_text, usage: resp.usage };
  const events = [];
  for await (const e of await api.responses.create({ model: "tiny", input: "Hello",
                                                     max_output_tokens: 16, stream: true }))
    events.push(e.type);
  out.responses_stream = events;
  out.missing = await errorOf(() => api.chat.completions.create({ model: "nope",
                                                                  messages: hello }));
  const bad = new OpenAI({ baseURL: base + "/v1", apiKey: "phk-guess", maxRetries: 0 });
  out.wrong_key = await errorOf(() => bad.chat.completions.create({ model: LLAMA,
                                                                    messages: hello }));
  return out;
}

async function ollama() {
  const api = new Ollama({ host: base, headers: { Authorization: `Bearer ${key}` } });
  const out = {};
  out.version = (await api.version()).version;
  out.listed = (await api.list()).models.map((m) => m.model);
  const chat = await api.chat({ model: LLAMA, messages: hello, options: { num_predict: 5 } });
  out.chat = { content: chat.message.content, done: chat.done,
               prompt_eval_count: chat.prompt_eval_count };
  const parts = [];
  for await (const p of await api.chat({ model: LLAMA, messages: hello, stream: true,
                                         options: { num_predict: 5 } })) parts.push(p);
  out.stream = { text: parts.map((p) => p.message.content).join(""),
                 done: parts.at(-1).done, eval_count: parts.at(-1).eval_count };
  const turn2 = [...hello, { role: "assistant", content: chat.message.content },
                 { role: "user", content: NEXT }];
  out.turn2 = (await api.chat({ model: LLAMA, messages: turn2,
                                options: { num_predict: 5 } })).message.content;
  out.generate = (await api.generate({ model: LLAMA, prompt: "Once upon",
                                       options: { num_predict: 5 } })).response;
  const gparts = [];
  for await (const p of await api.generate({ model: LLAMA, prompt: "Once upon", stream: true,
                                             options: { num_predict: 5 } })) gparts.push(p);
  out.generate_stream_done = gparts.at(-1).done;
  const bare = new Ollama({ host: base });
  out.no_key = await errorOf(() => bare.chat({ model: LLAMA, messages: hello }));
  return out;
}

const drivers = { openai, ollama };
try {
  const result = await drivers[client]();
  process.stdout.write(JSON.stringify(result) + "\n");
} catch (e) {
  process.stderr.write(`${client} driver failed: ${e.stack ?? e}\n`);
  process.exit(1);
}
