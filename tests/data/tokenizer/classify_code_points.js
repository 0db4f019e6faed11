// Prints, for every code point 0..0x10FFFF, the class GPT-2's regex gives it
// under node's Unicode tables: 's' (\s), 'L' (\p{L}), 'N' (\p{N}) or '.' (other).
// Surrogates (not characters) print '.'.
'use strict';
const classes = new Uint8Array(0x110000);
for (let cp = 0; cp < 0x110000; cp++) {
  const ch = cp >= 0xd800 && cp <= 0xdfff ? '' : String.fromCodePoint(cp);
  let c = 0x2e;
  if (ch !== '') {
    if (/^\s$/u.test(ch)) c = 0x73;
    else if (/^\p{L}$/u.test(ch)) c = 0x4c;
    else if (/^\p{N}$/u.test(ch)) c = 0x4e;
  }
  classes[cp] = c;
}
process.stdout.write(Buffer.from(classes));
