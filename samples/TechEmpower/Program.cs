using Kestrel.Transport.Linux;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.Options;
using TechEmpower;

// TechEmpower plaintext and JSON on Kestrel, over the Linux transport by default.
// Run with --help for the options.

if (!SampleOptions.TryParse(args, out var options, out var error))
{
    Console.Error.WriteLine($"error: {error}");
    Console.Error.WriteLine();
    Console.Error.WriteLine(SampleOptions.Usage);
    return SampleOptions.UsageExitCode;
}

if (options.ShowHelp)
{
    Console.WriteLine(SampleOptions.Usage);
    return 0;
}

const string InlineCompletionsVariable = "DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS";
if (options.Transport == SampleTransport.Sockets
    && options.Scheduling == SampleScheduling.Inline
    && Environment.GetEnvironmentVariable(InlineCompletionsVariable) is null)
{
    // The Sockets transport's inline mode only pays off when socket completions also run on the
    // epoll thread; the runtime reads this variable when it first creates its socket engine,
    // which has not happened yet. An explicit value in the environment is left alone.
    Environment.SetEnvironmentVariable(InlineCompletionsVariable, "1");
}

// The command line is parsed above, so the host gets none of it; configuration still comes from
// environment variables (for example Kestrel__LinuxTransport__AioReceive=true).
var builder = WebApplication.CreateSlimBuilder();
builder.Logging.SetMinimumLevel(LogLevel.Warning);
builder.WebHost.UseUrls(options.Urls);

switch (options.Transport)
{
    case SampleTransport.Linux:
        builder.WebHost.UseLinuxTransport(o =>
        {
            if (options.Threads is int threads)
            {
                o.ThreadCount = threads;
            }

            if (options.Scheduling is SampleScheduling scheduling)
            {
                o.ApplicationSchedulingMode = scheduling == SampleScheduling.Inline
                    ? ApplicationSchedulingMode.Inline
                    : ApplicationSchedulingMode.ThreadPool;
            }
        });
        break;

    case SampleTransport.Sockets:
        builder.WebHost.UseSockets(o =>
        {
            if (options.Threads is int threads)
            {
                o.IOQueueCount = threads;
            }

            if (options.Scheduling is SampleScheduling scheduling)
            {
                o.UnsafePreferInlineScheduling = scheduling == SampleScheduling.Inline;
            }
        });
        break;
}

var app = builder.Build();
app.Run(TechEmpowerMiddleware.Invoke);

await app.StartAsync();

// The hot path logs nothing; this one line says what is running.
var addresses = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()?.Addresses;
var urls = addresses is { Count: > 0 } ? string.Join(", ", addresses) : options.Urls;
if (options.Transport == SampleTransport.Linux)
{
    var linux = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value;
    Console.WriteLine(
        $"TechEmpower: transport=linux threads={linux.ThreadCount} scheduling={linux.ApplicationSchedulingMode} urls={urls}");
}
else
{
    var sockets = app.Services.GetRequiredService<IOptions<SocketTransportOptions>>().Value;
    var inline = sockets.UnsafePreferInlineScheduling;
    var completions = Environment.GetEnvironmentVariable(InlineCompletionsVariable) == "1" ? "inline" : "threadpool";
    Console.WriteLine(
        $"TechEmpower: transport=sockets threads={sockets.IOQueueCount} scheduling={(inline ? "Inline" : "ThreadPool")} socket-completions={completions} urls={urls}");
}

await app.WaitForShutdownAsync();
return 0;
