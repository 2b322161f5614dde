/** RFC 1924's alphabet, as Python's `base64.b85encode` and `b85decode` use it. */
const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~';

/**
 * Python's `base64.b85encode(data)` (no padding): Node has no base85. Each 4 bytes, big-endian, are
 * 5 digits, most significant first; a short last group is padded with zeros and its extra digits
 * dropped, as `b85decode` expects.
 */
export function base85(data: Uint8Array): string {
  const padded = new Uint8Array(Math.ceil(data.length / 4) * 4);
  padded.set(data);
  const view = new DataView(padded.buffer);
  let out = '';
  for (let i = 0; i < padded.length; i += 4) {
    let word = view.getUint32(i);
    const digits = new Array<string>(5);
    for (let k = 4; k >= 0; k--) {
      digits[k] = ALPHABET[word % 85] ?? '';
      word = Math.floor(word / 85);
    }
    out += digits.join('');
  }
  return out.slice(0, out.length - (padded.length - data.length));
}
