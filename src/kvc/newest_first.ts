// An insertion-ordered set of keys with values, iterated NEWEST first, with O(1) add, delete and
// lookup: a Map from key to a node of a doubly linked list. The replica segment of LruIndex needs
// it (duplicates are evicted newest first, and a duplicate read here goes to the oldest end, see
// lru_index.ts); a JS Map iterates oldest first only and can only append.
interface Node<K, V> {
  key: K;
  value: V;
  newer: Node<K, V> | null;
  older: Node<K, V> | null;
}

export class NewestFirst<K, V> {
  private readonly nodes = new Map<K, Node<K, V>>();
  private newest: Node<K, V> | null = null;
  private oldest: Node<K, V> | null = null;

  get size(): number {
    return this.nodes.size;
  }

  has(key: K): boolean {
    return this.nodes.has(key);
  }

  get(key: K): V | undefined {
    return this.nodes.get(key)?.value;
  }

  /** Adds `key` as the newest (moving it there when present). */
  set(key: K, value: V): void {
    this.delete(key);
    const n: Node<K, V> = { key, value, newer: null, older: this.newest };
    if (this.newest) this.newest.newer = n;
    this.newest = n;
    this.oldest ??= n;
    this.nodes.set(key, n);
  }

  /** Adds `key` as the oldest, i.e. the last one iterated (moving it there when present). */
  setOldest(key: K, value: V): void {
    this.delete(key);
    const n: Node<K, V> = { key, value, newer: this.oldest, older: null };
    if (this.oldest) this.oldest.older = n;
    this.oldest = n;
    this.newest ??= n;
    this.nodes.set(key, n);
  }

  delete(key: K): boolean {
    const n = this.nodes.get(key);
    if (!n) return false;
    this.nodes.delete(key);
    if (n.newer) n.newer.older = n.older;
    else this.newest = n.older;
    if (n.older) n.older.newer = n.newer;
    else this.oldest = n.newer;
    return true;
  }

  /** Newest first. */
  *entries(): IterableIterator<[K, V]> {
    for (let n = this.newest; n; n = n.older) yield [n.key, n.value];
  }

  *keys(): IterableIterator<K> {
    for (let n = this.newest; n; n = n.older) yield n.key;
  }
}
