using System.Diagnostics.Tracing;
using System.Globalization;

namespace TechEmpower;

/// <summary>
/// With TECHEMPOWER_THREADPOOL_LOG=1 in the environment, writes to stderr every thread-pool size
/// change the runtime makes, with its reason (the runtime's ThreadPoolWorkerThreadAdjustmentAdjustment
/// event: 0 warm-up, 1 initializing, 2 random move, 3 climbing move, 4 change point, 5 stabilizing,
/// 6 starvation, 7 thread timed out, 8 cooperative blocking), and every 2 s the pool's thread count,
/// queue length and completed work items per second. It is how the benchmarks found a dispatch batch
/// that the pool took for a blocked thread (docs/benchmarks/dispatch-turns.md).
/// </summary>
internal sealed class ThreadPoolLog : EventListener
{
    public const string Variable = "TECHEMPOWER_THREADPOOL_LOG";

    private const EventKeywords ThreadingKeyword = (EventKeywords)0x10000;

    private ThreadPoolLog()
    {
    }

    public static void StartIfRequested()
    {
        if (Environment.GetEnvironmentVariable(Variable) != "1")
        {
            return;
        }

        _ = new ThreadPoolLog();
        new Thread(Sample) { IsBackground = true, Name = "thread-pool log" }.Start();
    }

    private static void Sample()
    {
        long last = ThreadPool.CompletedWorkItemCount;
        while (true)
        {
            Thread.Sleep(2000);
            long completed = ThreadPool.CompletedWorkItemCount;
            Console.Error.WriteLine(string.Create(CultureInfo.InvariantCulture,
                $"threadpool: threads={ThreadPool.ThreadCount} pending={ThreadPool.PendingWorkItemCount} completed/s={(completed - last) / 2}"));
            last = completed;
        }
    }

    protected override void OnEventSourceCreated(EventSource eventSource)
    {
        if (eventSource.Name == "Microsoft-Windows-DotNETRuntime")
        {
            EnableEvents(eventSource, EventLevel.Informational, ThreadingKeyword);
        }
    }

    protected override void OnEventWritten(EventWrittenEventArgs eventData)
    {
        if (eventData.EventName == "ThreadPoolWorkerThreadAdjustmentAdjustment" && eventData.Payload is { } payload && eventData.PayloadNames is { } names)
        {
            object? Value(string name) => names.IndexOf(name) is var i and >= 0 ? payload[i] : null;
            Console.Error.WriteLine(string.Create(CultureInfo.InvariantCulture,
                $"threadpool: adjustment to {Value("NewWorkerThreadCount")} workers, reason {Value("Reason")}, average throughput {Value("AverageThroughput"):F1}/s"));
        }
    }
}
