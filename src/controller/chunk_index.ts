// The controller's global chunk index: chunk key → the holders that have it, where a holder is
// one (worker, location) pair, numbered with a small integer. Most keys have one holder, so an
// entry is a bare number and becomes an array only when a second holder appears; this keeps
// 1M keys at roughly one Map slot each and ingest at several million keys per second.
//
// Holders also count their keys (exactly: add/remove report whether they changed anything), so
// GET /instances needs no scan. Dropping a whole holder (reaping, re-sync) scans the map once:
// rare, and ~50 ms for a million keys, which is cheaper than a second per-holder key set on
// every admit.

type Entry = number | number[];

export class ChunkIndex {
  private readonly map = new Map<string, Entry>();
  private readonly counts = new Map<number, number>();

  get size(): number {
    return this.map.size;
  }

  count(holder: number): number {
    return this.counts.get(holder) ?? 0;
  }

  private bump(holder: number, d: number): void {
    this.counts.set(holder, (this.counts.get(holder) ?? 0) + d);
  }

  add(key: string, holder: number): boolean {
    const e = this.map.get(key);
    if (e === undefined) {
      this.map.set(key, holder);
    } else if (typeof e === 'number') {
      if (e === holder) return false;
      this.map.set(key, [e, holder]);
    } else {
      if (e.includes(holder)) return false;
      e.push(holder);
    }
    this.bump(holder, 1);
    return true;
  }

  addMany(keys: readonly string[], holder: number): void {
    let added = 0;
    const map = this.map;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      const e = map.get(key);
      if (e === undefined) map.set(key, holder);
      else if (typeof e === 'number') {
        if (e === holder) continue;
        map.set(key, [e, holder]);
      } else {
        if (e.includes(holder)) continue;
        e.push(holder);
      }
      added++;
    }
    if (added) this.bump(holder, added);
  }

  remove(key: string, holder: number): boolean {
    const e = this.map.get(key);
    if (e === undefined) return false;
    if (typeof e === 'number') {
      if (e !== holder) return false;
      this.map.delete(key);
    } else {
      const i = e.indexOf(holder);
      if (i < 0) return false;
      e.splice(i, 1);
      if (e.length === 1) this.map.set(key, e[0]!);
    }
    this.bump(holder, -1);
    return true;
  }

  removeMany(keys: readonly string[], holder: number): void {
    for (let i = 0; i < keys.length; i++) this.remove(keys[i]!, holder);
  }

  /** Forgets every key of the given holders (one scan of the map). */
  dropHolders(holders: ReadonlySet<number>): void {
    if (holders.size === 0) return;
    for (const [key, e] of this.map) {
      if (typeof e === 'number') {
        if (holders.has(e)) this.map.delete(key);
      } else {
        const kept = e.filter((h) => !holders.has(h));
        if (kept.length === e.length) continue;
        if (kept.length === 0) this.map.delete(key);
        else this.map.set(key, kept.length === 1 ? kept[0]! : kept);
      }
    }
    for (const h of holders) this.counts.delete(h);
  }

  has(key: string, holder: number): boolean {
    const e = this.map.get(key);
    if (e === undefined) return false;
    return typeof e === 'number' ? e === holder : e.includes(holder);
  }

  /**
   * Prefix matching: for each holder that has keys[0], how many leading keys it holds.
   * Keys chain (each identifies its whole prefix), so a holder's match ends at its first gap.
   * Calls `out(holder, n)` once per holder with n ≥ 1.
   */
  prefixMatches(keys: readonly string[], out: (holder: number, n: number) => void): void {
    if (keys.length === 0) return;
    const first = this.map.get(keys[0]!);
    if (first === undefined) return;
    // Live candidates: holders still matching after i keys. Usually one or two.
    let live: number[] = typeof first === 'number' ? [first] : first.slice();
    for (let i = 1; i < keys.length && live.length; i++) {
      const e = this.map.get(keys[i]!);
      if (e === undefined) {
        for (const h of live) out(h, i);
        return;
      }
      if (typeof e === 'number') {
        if (live.length === 1 && live[0] === e) continue;
        const next: number[] = [];
        for (const h of live) {
          if (h === e) next.push(h);
          else out(h, i);
        }
        live = next;
      } else {
        const next: number[] = [];
        for (const h of live) {
          if (e.includes(h)) next.push(h);
          else out(h, i);
        }
        live = next;
      }
    }
    for (const h of live) out(h, keys.length);
  }
}
