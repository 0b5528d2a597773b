// "Stored before" for the hit-rate ledger (docs/ledger.md): the keys any instance admitted, so that
// a computed chunk held nowhere now can be told apart as `evicted` (stored before) or `cold`.
//
// Bounded in two generations of `capacity / 2` keys each: new keys go into the young set; when it
// is full, the old one is dropped and the young one becomes old. So at least the last
// capacity / 2 distinct keys admitted are remembered, and at most `capacity` (with the default of
// STORED_HISTORY_KEYS = 2,097,152, about 64 MB at the worst). A key is kept as the 53 low bits of
// its 64 (a JS number, no string per key); two keys that agree in those bits are taken as one:
// with xxh64 keys, one chance in 2^53 per pair.

export class StoredHistory {
  private young = new Set<number>();
  private old = new Set<number>();
  /** Keys forgotten so far (when a generation was dropped). */
  forgotten = 0;

  constructor(readonly capacity: number) {
    if (!(Number.isInteger(capacity) && capacity >= 2)) throw new Error(`stored history: expected a capacity of at least 2 keys, found ${capacity}`);
  }

  private static id(hi: number, lo: number): number {
    return (hi & 0x1fffff) * 0x1_0000_0000 + (lo >>> 0);
  }

  add(hi: number, lo: number): void {
    const k = StoredHistory.id(hi, lo);
    if (this.young.has(k)) return;
    this.young.add(k);
    if (this.young.size >= this.capacity / 2) {
      this.forgotten += this.old.size;
      this.old = this.young;
      this.young = new Set();
    }
  }

  /** Adds every key of a packed list (8 bytes each, big-endian). */
  addPacked(keys: Uint8Array): void {
    const dv = new DataView(keys.buffer, keys.byteOffset, keys.byteLength);
    for (let o = 0; o + 8 <= keys.byteLength; o += 8) this.add(dv.getUint32(o), dv.getUint32(o + 4));
  }

  has(hi: number, lo: number): boolean {
    const k = StoredHistory.id(hi, lo);
    return this.young.has(k) || this.old.has(k);
  }

  get size(): number {
    return this.young.size + this.old.size;
  }
}
