// zeromq v6 allows one send in flight per socket; SendQueue serialises sends and never throws.
// Shared by both ends of the monitor channel (the controller's ROUTER and every cache
// instance's DEALER), so it lives here rather than in either component.

/** Sends that cannot be queued (peer gone, `immediate` set) are reported to `onDrop`. */
export class SendQueue {
  private tail: Promise<void> = Promise.resolve();
  constructor(
    private readonly sendFn: (frames: Buffer | Buffer[]) => Promise<void>,
    private readonly onDrop: (err: unknown) => void,
  ) {}

  send(frames: Buffer | Buffer[]): Promise<void> {
    this.tail = this.tail.then(() => this.sendFn(frames)).catch((e) => this.onDrop(e));
    return this.tail;
  }
}
