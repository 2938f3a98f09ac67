using System.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>Watches an event loop's thread from outside, through /proc.</summary>
internal static class LoopThread
{
    /// <summary>
    /// True once the loop's thread has been seen blocked in the kernel (asleep in epoll_wait, when
    /// nothing else runs on it) <paramref name="samplesInARow"/> times in a row, 1 ms apart; false if
    /// that has not happened within <paramref name="timeout"/>.
    /// </summary>
    public static bool WaitUntilAsleep(EventLoop loop, TimeSpan timeout, int samplesInARow)
    {
        var deadline = Stopwatch.StartNew();
        while (loop.ThreadId == 0)
        {
            if (deadline.Elapsed > timeout)
            {
                return false;
            }

            Thread.Sleep(1);
        }

        var stat = $"/proc/self/task/{loop.ThreadId}/stat";
        int asleep = 0;
        while (asleep < samplesInARow)
        {
            if (deadline.Elapsed > timeout)
            {
                return false;
            }

            asleep = Affinity.IsThreadBlocked(stat) ? asleep + 1 : 0;
            Thread.Sleep(1);
        }

        return true;
    }
}
