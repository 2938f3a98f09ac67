using System.Net;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>What <see cref="Downstream"/> does with the next requests.</summary>
public enum DownstreamAnswer
{
    /// <summary><c>{"message":"Hello, World!"}</c> as application/json, as the C ceiling server's /json answers.</summary>
    Json,

    /// <summary>A text with a charset parameter in its content type, to see the type passed on whole.</summary>
    Text,

    /// <summary>500 with a body: a downstream that answers, but fails.</summary>
    ServerError,

    /// <summary>No answer: the request waits until its caller goes away, which <see cref="Downstream.Abandoned"/> reports.</summary>
    Hang,
}

/// <summary>
/// The downstream service of the sample's GET /await: a real Kestrel server in the test process (Sockets transport, HTTP/1.1,
/// loopback, a kernel-picked port) whose one URL answers as <see cref="Answer"/> says, and which counts the connections and
/// requests it gets.
/// </summary>
public sealed class Downstream : IAsyncDisposable
{
    /// <summary>The body of <see cref="DownstreamAnswer.Text"/>.</summary>
    public const string TextBody = "downstream text";

    /// <summary>The content type of <see cref="DownstreamAnswer.Text"/>.</summary>
    public const string TextContentType = "text/plain; charset=utf-8";

    private readonly WebApplication _app;
    private int _connections;
    private int _requests;
    private volatile DownstreamAnswer _answer;
    private TaskCompletionSource _hanging = NewSignal();
    private TaskCompletionSource _abandoned = NewSignal();

    private Downstream(WebApplication app) => _app = app;

    /// <summary>The URL that answers, with its real port.</summary>
    public string Url { get; private set; } = "";

    /// <summary>What the next requests get; <see cref="DownstreamAnswer.Json"/> at first.</summary>
    public DownstreamAnswer Answer
    {
        get => _answer;
        set => _answer = value;
    }

    /// <summary>TCP connections accepted so far.</summary>
    public int Connections => Volatile.Read(ref _connections);

    /// <summary>Requests received so far.</summary>
    public int Requests => Volatile.Read(ref _requests);

    /// <summary>Completes when a <see cref="DownstreamAnswer.Hang"/> request has arrived (since the last <see cref="ResetSignals"/>).</summary>
    public Task Hanging => _hanging.Task;

    /// <summary>Completes when a <see cref="DownstreamAnswer.Hang"/> request was aborted by its caller.</summary>
    public Task Abandoned => _abandoned.Task;

    /// <summary>Starts the server.</summary>
    /// <returns>The running downstream.</returns>
    public static async Task<Downstream> StartAsync()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        Downstream? downstream = null;
        builder.WebHost.UseKestrel(kestrel => kestrel.Listen(IPAddress.Loopback, 0, listen => listen.Use(next => connection =>
        {
            Interlocked.Increment(ref downstream!._connections);
            return next(connection);
        })));

        var app = builder.Build();
        downstream = new Downstream(app);
        app.Run(downstream.HandleAsync);
        await app.StartAsync();
        var address = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();
        downstream.Url = $"{address}/downstream";
        return downstream;
    }

    /// <summary>Makes <see cref="Hanging"/> and <see cref="Abandoned"/> wait for the next hanging request.</summary>
    public void ResetSignals()
    {
        _hanging = NewSignal();
        _abandoned = NewSignal();
    }

    /// <inheritdoc />
    public async ValueTask DisposeAsync() => await _app.DisposeAsync();

    private static TaskCompletionSource NewSignal() => new(TaskCreationOptions.RunContinuationsAsynchronously);

    private async Task HandleAsync(HttpContext context)
    {
        Interlocked.Increment(ref _requests);
        var response = context.Response;
        switch (_answer)
        {
            case DownstreamAnswer.Json:
                response.ContentType = "application/json";
                await response.WriteAsync("""{"message":"Hello, World!"}""");
                break;

            case DownstreamAnswer.Text:
                response.ContentType = TextContentType;
                await response.WriteAsync(TextBody);
                break;

            case DownstreamAnswer.ServerError:
                response.StatusCode = StatusCodes.Status500InternalServerError;
                await response.WriteAsync("downstream broke");
                break;

            default:
                _hanging.TrySetResult();
                try
                {
                    await Task.Delay(Timeout.Infinite, context.RequestAborted);
                }
                catch (OperationCanceledException)
                {
                    _abandoned.TrySetResult();
                }

                break;
        }
    }
}
