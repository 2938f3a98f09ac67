using System.Collections.Concurrent;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// Writes server and transport log messages into the test's output, so a failing test shows what the
/// transport reported, and into <c>record</c> when one is given, so a test can check them. Messages that
/// arrive after the test finished (a loop thread logging late) are dropped from the output: xunit throws for
/// them, and a logger must never throw into the transport.
/// </summary>
internal sealed class TestOutputLoggerProvider(ITestOutputHelper output, LogLevel minimumLevel = LogLevel.Information, ConcurrentQueue<string>? record = null) : ILoggerProvider
{
    public ILogger CreateLogger(string categoryName) => new TestOutputLogger(output, categoryName, minimumLevel, record);

    public void Dispose()
    {
    }

    public static ILoggerFactory CreateFactory(ITestOutputHelper output, LogLevel minimumLevel = LogLevel.Information, ConcurrentQueue<string>? record = null)
        => LoggerFactory.Create(builder =>
        {
            builder.SetMinimumLevel(minimumLevel);
            builder.AddProvider(new TestOutputLoggerProvider(output, minimumLevel, record));
        });

    private sealed class TestOutputLogger(ITestOutputHelper output, string category, LogLevel minimumLevel, ConcurrentQueue<string>? record) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => logLevel >= minimumLevel;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (!IsEnabled(logLevel))
            {
                return;
            }

            var line = $"{DateTime.UtcNow:HH:mm:ss.fff} [{logLevel}] {category}[{eventId.Id}]: {formatter(state, exception)}";
            record?.Enqueue(line);
            if (exception is not null)
            {
                line += Environment.NewLine + exception;
            }

            try
            {
                output.WriteLine(line);
            }
            catch (InvalidOperationException)
            {
                // The test this output belongs to has finished.
            }
        }
    }
}
