// The controller's global chunk index: chunk key → the holders that have it, where a holder is
// one (worker, location) pair, numbered with a small positive integer.
//
// Representation, chosen for ingest ≥ 1M keys/s and lookups in microseconds at 1M+ keys: an
// open-addressing hash table (linear probing) over typed arrays. A key is its 64 bits as two
// uint32 halves (keys are xxh64 outputs, so the low half is already a good hash); the value is
// the holder number, or -(i+1) pointing at a small array of holders in `multi` when several
// holders have the key. No per-key JS object, no strings: ingest is a probe and two stores.
// On the wire keys arrive as 8-byte big-endian binary (the hex string's bytes).
//
// Holders count their keys (add/remove report whether they changed anything), so
// GET /instances needs no scan. Dropping whole holders (sign-off, reaping, re-sync) rebuilds the
// table once: rare, and tens of milliseconds for a million keys; the same walk reports the keys
// left on other holders (replica hints' last copies). A key's holders keep the order in which they
// admitted it: the first is where the chunk was computed or first kept (the replica hints' "first
// copy").

const EMPTY = 0;

export class ChunkIndex {
  private cap = 1 << 16;
  private mask = this.cap - 1;
  private hi = new Uint32Array(this.cap);
  private lo = new Uint32Array(this.cap);
  private val = new Int32Array(this.cap);
  private used = 0;
  private multi: number[][] = [];
  private freeMulti: number[] = [];
  private readonly counts = new Map<number, number>();

  get size(): number {
    return this.used;
  }

  count(holder: number): number {
    return this.counts.get(holder) ?? 0;
  }

  /** Every (key, holder) pair: each copy of each chunk once; `entries - size` copies are duplicates. */
  get entries(): number {
    let n = 0;
    for (const c of this.counts.values()) n += c;
    return n;
  }

  private bump(holder: number, d: number): void {
    this.counts.set(holder, (this.counts.get(holder) ?? 0) + d);
  }

  /** Slot of the key, or -1. */
  private find(hi: number, lo: number): number {
    let i = lo & this.mask;
    for (;;) {
      const v = this.val[i]!;
      if (v === EMPTY) return -1;
      if (this.lo[i] === lo && this.hi[i] === hi) return i;
      i = (i + 1) & this.mask;
    }
  }

  private grow(): void {
    const { hi, lo, val, cap } = this;
    this.cap = cap * 2;
    this.mask = this.cap - 1;
    this.hi = new Uint32Array(this.cap);
    this.lo = new Uint32Array(this.cap);
    this.val = new Int32Array(this.cap);
    for (let j = 0; j < cap; j++) {
      const v = val[j]!;
      if (v === EMPTY) continue;
      let i = lo[j]! & this.mask;
      while (this.val[i] !== EMPTY) i = (i + 1) & this.mask;
      this.hi[i] = hi[j]!;
      this.lo[i] = lo[j]!;
      this.val[i] = v;
    }
  }

  private newMulti(a: number, b: number): number {
    const m = this.freeMulti.pop();
    if (m !== undefined) {
      this.multi[m] = [a, b];
      return -(m + 1);
    }
    this.multi.push([a, b]);
    return -this.multi.length;
  }

  /** Adds holder to key (hi, lo): 0 when it was there already, 1 when added as the key's only holder, 2 when added beside other holders. */
  addHalves(hi: number, lo: number, holder: number): 0 | 1 | 2 {
    if ((this.used + 1) * 4 > this.cap * 3) this.grow();
    let i = lo & this.mask;
    for (;;) {
      const v = this.val[i]!;
      if (v === EMPTY) {
        this.hi[i] = hi;
        this.lo[i] = lo;
        this.val[i] = holder;
        this.used++;
        return 1;
      }
      if (this.lo[i] === lo && this.hi[i] === hi) {
        if (v === holder) return 0;
        if (v > 0) {
          this.val[i] = this.newMulti(v, holder);
          return 2;
        }
        const hs = this.multi[-v - 1]!;
        if (hs.includes(holder)) return 0;
        hs.push(holder);
        return 2;
      }
      i = (i + 1) & this.mask;
    }
  }

  /**
   * Removes holder from key: 0 when it was not there, 1 when removed and the key is gone, 2 when
   * removed and other holders remain, 3 when removed as the key's FIRST holder (the oldest
   * admission; holders keep admission order) and other holders remain.
   */
  removeHalves(hi: number, lo: number, holder: number): 0 | 1 | 2 | 3 {
    const i = this.find(hi, lo);
    if (i < 0) return 0;
    const v = this.val[i]!;
    if (v > 0) {
      if (v !== holder) return 0;
      this.deleteSlot(i);
      return 1;
    }
    const m = -v - 1;
    const hs = this.multi[m]!;
    const k = hs.indexOf(holder);
    if (k < 0) return 0;
    hs.splice(k, 1);
    if (hs.length === 1) {
      this.val[i] = hs[0]!;
      this.multi[m] = [];
      this.freeMulti.push(m);
    }
    return k === 0 ? 3 : 2;
  }

  /** Backward-shift deletion: keeps probe chains intact without tombstones. */
  private deleteSlot(i: number): void {
    const mask = this.mask;
    let hole = i;
    let j = (i + 1) & mask;
    while (this.val[j] !== EMPTY) {
      const home = this.lo[j]! & mask;
      // Move j into the hole when its home is not in (hole, j] cyclically.
      if ((j > hole && (home <= hole || home > j)) || (j < hole && home <= hole && home > j)) {
        this.hi[hole] = this.hi[j]!;
        this.lo[hole] = this.lo[j]!;
        this.val[hole] = this.val[j]!;
        hole = j;
      }
      j = (j + 1) & mask;
    }
    this.val[hole] = EMPTY;
    this.used--;
  }

  /** Appends the holders of key (hi, lo) to `out` (none when it is not indexed); returns `out`. */
  holdersOf(hi: number, lo: number, out: number[]): number[] {
    const i = this.find(hi, lo);
    if (i < 0) return out;
    const v = this.val[i]!;
    if (v > 0) out.push(v);
    else for (const h of this.multi[-v - 1]!) out.push(h);
    return out;
  }

  /**
   * Applies a packed list of 8-byte big-endian keys. `shared(hi, lo)`, if given, is called for
   * each key added beside other holders (the replica hints; no second probe per key).
   */
  addPacked(keys: Uint8Array, holder: number, shared?: (hi: number, lo: number) => void): number {
    const dv = new DataView(keys.buffer, keys.byteOffset, keys.byteLength);
    let n = 0;
    for (let o = 0; o + 8 <= keys.byteLength; o += 8) {
      const hi = dv.getUint32(o);
      const lo = dv.getUint32(o + 4);
      const r = this.addHalves(hi, lo, holder);
      if (r === 0) continue;
      n++;
      if (r === 2 && shared) shared(hi, lo);
    }
    if (n) this.bump(holder, n);
    return n;
  }

  /**
   * Removes a packed list; `left(hi, lo, firstLeft)`, if given, is called for each key other
   * holders still hold, `firstLeft` true when `holder` was the key's first (oldest) holder.
   */
  removePacked(keys: Uint8Array, holder: number, left?: (hi: number, lo: number, firstLeft: boolean) => void): number {
    const dv = new DataView(keys.buffer, keys.byteOffset, keys.byteLength);
    let n = 0;
    for (let o = 0; o + 8 <= keys.byteLength; o += 8) {
      const hi = dv.getUint32(o);
      const lo = dv.getUint32(o + 4);
      const r = this.removeHalves(hi, lo, holder);
      if (r === 0) continue;
      n++;
      if (r >= 2 && left) left(hi, lo, r === 3);
    }
    if (n) this.bump(holder, -n);
    return n;
  }

  add(key: string, holder: number): boolean {
    const ok = this.addHalves(parseInt(key.slice(0, 8), 16) >>> 0, parseInt(key.slice(8, 16), 16) >>> 0, holder) !== 0;
    if (ok) this.bump(holder, 1);
    return ok;
  }

  remove(key: string, holder: number): boolean {
    const ok = this.removeHalves(parseInt(key.slice(0, 8), 16) >>> 0, parseInt(key.slice(8, 16), 16) >>> 0, holder) !== 0;
    if (ok) this.bump(holder, -1);
    return ok;
  }

  has(key: string, holder: number): boolean {
    const i = this.find(parseInt(key.slice(0, 8), 16) >>> 0, parseInt(key.slice(8, 16), 16) >>> 0);
    if (i < 0) return false;
    const v = this.val[i]!;
    return v > 0 ? v === holder : this.multi[-v - 1]!.includes(holder);
  }

  /**
   * Forgets every key of the given holders by rebuilding the table from the survivors (in the
   * order they held it). `left(hi, lo, firstLeft)`, if given, is called for each key that lost at
   * least one of those holders and kept at least one other (the replica hints' last copies),
   * `firstLeft` true when the key's first holder was dropped, once the rebuild is complete, so
   * `holdersOf` inside it sees the new table. The keys are gathered during the one walk the
   * rebuild makes anyway: no second pass over the table.
   */
  dropHolders(holders: ReadonlySet<number>, left?: (hi: number, lo: number, firstLeft: boolean) => void): void {
    if (holders.size === 0) return;
    const { hi, lo, val, cap } = this;
    this.hi = new Uint32Array(cap);
    this.lo = new Uint32Array(cap);
    this.val = new Int32Array(cap);
    this.used = 0;
    const oldMulti = this.multi;
    this.multi = [];
    this.freeMulti = [];
    /** (hi, lo, firstLeft) triples of the keys to report, grown by doubling. */
    let kept = new Uint32Array(left ? 3072 : 0);
    let nKept = 0;
    for (let j = 0; j < cap; j++) {
      const v = val[j]!;
      if (v === EMPTY) continue;
      if (v > 0) {
        if (!holders.has(v)) this.addHalves(hi[j]!, lo[j]!, v);
      } else {
        let dropped = false;
        let survived = false;
        const hs = oldMulti[-v - 1]!;
        for (const h of hs) {
          if (holders.has(h)) dropped = true;
          else {
            this.addHalves(hi[j]!, lo[j]!, h);
            survived = true;
          }
        }
        if (left && dropped && survived) {
          if (nKept + 3 > kept.length) {
            const k = new Uint32Array(kept.length * 2);
            k.set(kept);
            kept = k;
          }
          kept[nKept++] = hi[j]!;
          kept[nKept++] = lo[j]!;
          kept[nKept++] = holders.has(hs[0]!) ? 1 : 0;
        }
      }
    }
    for (const h of holders) this.counts.delete(h);
    if (left) for (let i = 0; i < nKept; i += 3) left(kept[i]!, kept[i + 1]!, kept[i + 2] === 1);
  }

  /**
   * Prefix matching: for each holder that has key 0, how many leading keys it holds.
   * Keys chain (each identifies its whole prefix), so a holder's match ends at its first gap.
   * Calls `out(holder, n)` once per holder with n ≥ 1.
   */
  prefixMatches(hi: Uint32Array, lo: Uint32Array, count: number, out: (holder: number, n: number) => void): void {
    if (count === 0) return;
    const i0 = this.find(hi[0]!, lo[0]!);
    if (i0 < 0) return;
    const v0 = this.val[i0]!;
    if (v0 > 0) {
      // Common case: one holder; walk until it no longer holds the key.
      let n = 1;
      for (; n < count; n++) {
        const i = this.find(hi[n]!, lo[n]!);
        if (i < 0) break;
        const v = this.val[i]!;
        if (v > 0 ? v !== v0 : !this.multi[-v - 1]!.includes(v0)) break;
      }
      out(v0, n);
      return;
    }
    let live = this.multi[-v0 - 1]!.slice();
    for (let n = 1; n < count && live.length; n++) {
      const i = this.find(hi[n]!, lo[n]!);
      const next: number[] = [];
      for (const h of live) {
        const v = i < 0 ? EMPTY : this.val[i]!;
        if (v !== EMPTY && (v > 0 ? v === h : this.multi[-v - 1]!.includes(h))) next.push(h);
        else out(h, n);
      }
      live = next;
    }
    for (const h of live) out(h, count);
  }
}
