// Builds the tokenizer test data in tests/tokenizer/golden/: a small deterministic BPE vocabulary in
// tiktoken format (kimi_test.tiktoken), a Kimi-style tokenizer_config.json for it, and golden text -> ids
// vectors computed by an independent implementation: the npm `tiktoken` package (WASM build of OpenAI's
// Rust tiktoken, which runs the verbatim Kimi pattern with fancy-regex, `&&` class intersections included).
//
// Run once, by hand (CI never needs npm; the outputs are committed):
//   mkdir -p /tmp/tokgold && cd /tmp/tokgold && npm install tiktoken@1.0.22
//   node /path/to/repo/scripts/make_tokenizer_golden.mjs            # golden vectors only
//   node /path/to/repo/scripts/make_tokenizer_golden.mjs --learn    # also re-learn the vocabulary
// `tiktoken` is resolved from the current directory, so node_modules stays outside the repository.
// Re-learning reads the spec files and two licence texts from /usr/share/common-licenses; the committed
// vocabulary is the reference, re-learning is only needed if the test vocabulary should change.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const outDir = path.join(repo, "tests/tokenizer/golden");
const vocabPath = path.join(outDir, "kimi_test.tiktoken");
const configPath = path.join(outDir, "kimi_test_tokenizer_config.json");
const goldenPath = path.join(outDir, "kimi_test_golden.json");

// 256 single bytes + 3,584 merges = 3,840 ranks; 256 special slots follow (Kimi: 163,584 + 256).
const kNumMerges = 3584;

// The Kimi pre-tokenizer pattern, verbatim from tokenization_kimi.py (Rust regex syntax).
const kKimiPattern = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// Named special tokens at their Kimi offsets from the first special id (spec section 7).
const kNamedSpecials = {
  0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
  6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
  11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
  14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
  254: "[UNK]", 255: "[PAD]",
};

// Multilingual samples so the vocabulary has merges inside CJK, Cyrillic, Greek, Arabic and emoji bytes.
const kSamples = [
  "深度学习模型的推理引擎需要高效的调度器和内存管理。我们的服务器支持流式输出和并发请求。",
  "线性注意力机制使得长上下文的推理成本保持恒定，状态的大小与序列长度无关。",
  "你好，世界！今天天气很好、我们去公园散步吧。中文、日本語、한국어都可以。",
  "日本語のテキストも含めます。東京は日本の首都です。ひらがなとカタカナと漢字。",
  "한국어 문장도 포함합니다. 서울은 대한민국의 수도입니다.",
  "Привет, мир! Это тестовый текст на русском языке для словаря.",
  "Γειά σου κόσμε! Αυτό είναι ένα δοκιμαστικό κείμενο.",
  "مرحبا بالعالم! هذا نص تجريبي باللغة العربية.",
  "Emoji: 😀 😃 😄 🚀 🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨ 🔥 🤖",
  "Café naïve résumé façade über Straße déjà vu coöperate",
  "    indented code\n\tif (x) {\n\t\treturn y;\n\t}\n\n",
  "Numbers 12345 3.14159 2024-06-01 1,000,000 0x7fff",
  "It's we're they've I'm you'll he'd DON'T WE'RE",
  // U+180E is White_Space for PCRE2's UCP \s but not for Rust's: merges across it make that trap visible.
  "wait!\u180Eabc ok!\u180E\u180E x\u180E  y \u180E\u180Ez",
];

function learnVocab() {
  const files = [
    "/work/shared/spec/kimi_linear.md", "/work/shared/spec/system.md", "/work/shared/deps.md",
    "/work/shared/style.md", "/work/shared/pitfalls.md",
    "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
  ];
  let text = "";
  for (const f of files) if (fs.existsSync(f)) text += fs.readFileSync(f, "utf8") + "\n";
  for (let r = 0; r < 20; r++) text += kSamples.join("\n") + "\n";
  // Training only needs a reasonable word split, not the exact Kimi one.
  const split = /[\p{Script=Han}]+|[^\r\n\p{L}\p{N}]?\p{L}+(?:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
  const counts = new Map();
  for (const m of text.matchAll(split)) counts.set(m[0], (counts.get(m[0]) || 0) + 1);
  const words = [...counts.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1))
    .map(([w, c]) => ({ ids: [...Buffer.from(w, "utf8")], count: c }));
  const tokens = [];
  for (let b = 0; b < 256; b++) tokens.push(Buffer.from([b]));
  for (let step = 0; step < kNumMerges; step++) {
    const pairs = new Map();
    for (const w of words)
      for (let i = 0; i + 1 < w.ids.length; i++) {
        const key = w.ids[i] * 65536 + w.ids[i + 1];
        pairs.set(key, (pairs.get(key) || 0) + w.count);
      }
    let best = -1, bestCount = 0;
    for (const [k, c] of pairs) if (c > bestCount || (c === bestCount && k < best)) { best = k; bestCount = c; }
    if (best < 0) throw new Error(`corpus too small: only ${step} merges`);
    const a = Math.floor(best / 65536), b = best % 65536, id = tokens.length;
    tokens.push(Buffer.concat([tokens[a], tokens[b]]));
    for (const w of words) {
      const out = [];
      for (let i = 0; i < w.ids.length; i++) {
        if (i + 1 < w.ids.length && w.ids[i] === a && w.ids[i + 1] === b) { out.push(id); i++; }
        else out.push(w.ids[i]);
      }
      w.ids = out;
    }
  }
  fs.writeFileSync(vocabPath, tokens.map((t, r) => `${t.toString("base64")} ${r}`).join("\n") + "\n");
}

function specialTokens(numBase) {
  const specials = {};
  for (let i = 0; i < 256; i++) specials[kNamedSpecials[i] ?? `<|reserved_token_${numBase + i}|>`] = numBase + i;
  return specials;
}

function writeConfig(numBase) {
  const decoder = {};
  for (const [off, name] of Object.entries(kNamedSpecials))
    decoder[String(numBase + Number(off))] = { content: name, lstrip: false, normalized: false, rstrip: false,
                                               single_word: false, special: true };
  const config = {
    added_tokens_decoder: decoder,
    bos_token: "[BOS]", eos_token: "[EOS]", pad_token: "[PAD]", unk_token: "[UNK]",
    tokenizer_class: "TikTokenTokenizer", model_max_length: 1e30,
  };
  fs.writeFileSync(configPath, JSON.stringify(config, null, 1) + "\n");
}

// HF TikTokenTokenizer.encode: 400,000-char windows, then runs of at most 25,000 consecutive whitespace or
// non-whitespace chars (Python str.isspace, code points), each piece encoded with allowed_special="all".
const kPySpace = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029,
  0x202f, 0x205f, 0x3000]);
function hfPieces(text) {
  const cps = [...text];
  const out = [];
  for (let w = 0; w < cps.length; w += 400000) {
    const s = cps.slice(w, w + 400000);
    let len = 0, isSpace = s.length ? kPySpace.has(s[0].codePointAt(0)) : false, start = 0;
    for (let i = 0; i < s.length; i++) {
      const now = kPySpace.has(s[i].codePointAt(0));
      if (isSpace !== now) { len = 1; isSpace = now; }
      else if (++len > 25000) { out.push(s.slice(start, i).join("")); start = i; len = 1; }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
}

// Deterministic generator (xorshift32) for the randomised differential cases.
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => { x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0; return x / 4294967296; };
}

function cases() {
  const fixed = [
    "", " ", "a", "Hello, world!", "hello world", "  leading spaces", "trailing spaces   ",
    "tabs\tand\nnewlines\r\nand\r\rcarriage returns", "\n\n\n", " \n \n", "a  b   c    d", "x \n\ny",
    "It's", "it's we're they've I'm you'll he'd", "IT'S WE'RE THEY'VE I'M YOU'LL HE'D", "don'T", "'s",
    "Itſ 'ſ", "o'clock rock'n'roll", "ʼs", "1", "12", "123", "1234", "1234567", "3.14159 2,500,000",
    "٣٤٥ ١٢٣٤", "½ ⅓ Ⅻ", "x²+y³", "v1.2.3-rc4",
    "你好，世界！", "中文、日本語、한국어", "、", "a、b", "漢字かな交じり文", "々〆〇", "东京2024年",
    "深度学习模型的推理引擎", "English中文English", "中文English中文",
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "❤️", "emoji 🚀 rocket", "😀abc", "abc😀",
    "Café naïve résumé", "e\u0301 combining", "\u0301\u0301", "Привет, мир!", "Γειά σου", "مرحبا بالعالم",
    "नमस्ते दुनिया", "ภาษาไทย", "A\u180Eb", "x\u00a0y", "a\u3000b", "a\u2028b", "\u000b\u000c", "\u001c\u001f",
    "<|im_end|>", "hello<|im_end|>world", "<|im_user|>user<|im_middle|>hi<|im_end|>",
    "[BOS][EOS]", "<|reserved_token_3900|>", "<|im_end|", "<|im_end|><|im_end|>", "< |im_end|>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
    "<html><body>code</body></html>", "def f(x):\n    return x**2\n\n\n", "    if (a) {\n\t\tb();\n\t}\n",
    "!!!???...", " !!", "\"quoted\" 'single'", "path/to/file.txt", "a\r\nb\r\n\r\nc",
    "   \n   ", "\t\t\n", " \t \n x", "\n \n a", "a \n", "x\u0085y",
    "it'ſ IT'ſ", "K\u212A'K", " \u180E\u180E  x", "a\u180E", "\u180E \n", "\u200b zero\u200bwidth",
    "wait!\u180Eabc", "ok!\u180E\u180E x", "\u180E  y", " \u180E\u180Ez",
  ];
  const pool = ["a", "b", "The", "quick", "ABC", "x", "Z", " ", "  ", "\t", "\n", "\r\n", "1", "42", "9999",
    "'s", "'T", "'re", "'LL", "’", ",", ".", "!", "?", "-", "(", ")", "{", "}", "中", "文", "、", "。",
    "日本", "한", "😀", "👍🏽", "é", "e\u0301", "ß", "Ω", "я", "ſ", "\u180E", "\u00a0", "\u3000", "٣", "Ⅻ",
    "<|im_end|>", "[EOS]", "<|im_middle|>", "<|", "|>", "<", "the ", "ing", "tion", " of", "model"];
  const rand = rng(20240601);
  const random = [];
  for (let i = 0; i < 400; i++) {
    const n = 1 + Math.floor(rand() * 24);
    let s = "";
    for (let j = 0; j < n; j++) s += pool[Math.floor(rand() * pool.length)];
    random.push(s);
  }
  // Runs longer than the 25,000-char split (HF splitting is applied by hfPieces below).
  // Stored as [fragment, count] parts so the golden file stays small.
  const long = [[["a", 25001]], [[" ", 25000], ["x", 1]], [["ab", 13000], [" ", 1], ["\n", 30000]],
                [["中", 26000]], [["x ", 1000]], [["Hello", 1], [" ", 24999], ["\u3000", 2], ["world", 1]]];
  return [...fixed.map((t) => ({ text: t })), ...random.map((t) => ({ text: t })), ...long.map((p) => ({ parts: p }))];
}

// Long cases store the count, the first and last 32 ids and a 64-bit FNV-1a hash over the ids (each as
// 4 little-endian bytes) instead of the whole list, so the golden file stays small.
function fnv1a64(ids) {
  let h = 0xcbf29ce484222325n;
  for (const id of ids)
    for (let k = 0; k < 4; k++) h = ((h ^ BigInt((id >>> (8 * k)) & 0xff)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, "0");
}

if (process.argv.includes("--learn") || !fs.existsSync(vocabPath)) learnVocab();
const vocab = fs.readFileSync(vocabPath, "utf8");
const numBase = vocab.trim().split("\n").length;
writeConfig(numBase);
const { Tiktoken } = createRequire(path.join(process.cwd(), "x.js"))("tiktoken");
const enc = new Tiktoken(vocab, specialTokens(numBase), kKimiPattern);
const golden = cases().map((c) => {
  const text = c.text ?? c.parts.map(([s, n]) => s.repeat(n)).join("");
  const ids = hfPieces(text).flatMap((p) => Array.from(enc.encode(p, "all")));
  if (c.text !== undefined) return { text, ids };
  return { parts: c.parts, count: ids.length, head: ids.slice(0, 32), tail: ids.slice(-32), fnv1a64: fnv1a64(ids) };
});
fs.writeFileSync(goldenPath, JSON.stringify({ generator: "npm tiktoken 1.0.22 (Rust tiktoken via WASM)",
                                              num_base_tokens: numBase, cases: golden }) + "\n");
console.log(`vocab ${numBase} ranks, ${golden.length} golden cases -> ${path.relative(repo, outDir)}`);
