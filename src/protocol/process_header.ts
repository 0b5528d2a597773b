// The header every kvc server's health route carries: the answering process's pid. `kvc up`
// waits for a child's health route, and a port found free can still be bound first by some other
// process; without the pid, that process's 200 would pass for the child's.
export const PID_HEADER = 'kvc-pid';
