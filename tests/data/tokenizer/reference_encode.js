// The reference for the tokenizer tests: encodes each line of a file with the
// npm package gpt-3-encoder and prints one JSON array of ids per line.
//   node reference_encode.js GPT_3_ENCODER_DIR FILE
// Lines are the bytes between '\n' (a final '\n' ends the last line); each is
// decoded as UTF-8 by node, which replaces invalid bytes with U+FFFD.
'use strict';
const fs = require('fs');
const { encode } = require(process.argv[2]);

const bytes = fs.readFileSync(process.argv[3]);
const out = [];
let start = 0;
while (start < bytes.length) {
  let end = bytes.indexOf(0x0a, start);
  if (end < 0) end = bytes.length;
  out.push(JSON.stringify(encode(bytes.subarray(start, end).toString('utf8'))));
  start = end + 1;
}
process.stdout.write(out.map((line) => line + '\n').join(''));
