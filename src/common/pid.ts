// Whether a process is alive, by pid: for files that name the process that owns something (a
// deployment's log directory, a model generation's temp folder).

/** True if a process with this pid exists (EPERM: it exists but belongs to someone else). */
export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
