using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>How a loop's own thread is scheduled.</summary>
internal static class LoopThreadPolicy
{
    /// <summary>
    /// Called on the loop's thread as it starts: CpuAffinity pins it to one CPU; the SchedBatchLoops tuning puts
    /// it under SCHED_BATCH (sched(7)), so a loop that wakes does not preempt the thread on its CPU and reads
    /// everything that arrived meanwhile in one pass. A refusal (a seccomp profile) is logged, never fatal.
    /// </summary>
    public static void Apply(LinuxTransportOptions options, int index, ILogger logger)
    {
        if (options.CpuAffinity)
        {
            var cpus = Affinity.AllowedCpus(out var result);
            if (cpus.Count > 0)
            {
                result = Affinity.PinCurrentThread(cpus[index % cpus.Count]);
            }

            if (result.IsError)
            {
                TransportLog.OptionNotApplied(logger, "CpuAffinity (sched_setaffinity)", $"loop {index}", Errno.Describe(result.Error));
            }
            else
            {
                TransportLog.LoopPinned(logger, index, cpus[index % cpus.Count]);
            }
        }

        if (options.Tuning.SchedBatchLoops)
        {
            var result = Affinity.SetCurrentThreadBatch();
            if (result.IsError)
            {
                TransportLog.OptionNotApplied(logger, "SchedBatchLoops (sched_setscheduler SCHED_BATCH)", $"loop {index}", Errno.Describe(result.Error));
            }
        }
    }
}
