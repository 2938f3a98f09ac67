using System.Buffers;
using System.Globalization;

namespace TechEmpower.Scenarios;

/// <summary>
/// GET /await: a handler that awaits I/O, as most real handlers do (a database, another service). For each request it
/// makes one HTTP call to the <c>--downstream</c> URL, awaits it, and answers with the downstream's body and content
/// type; 502 with a short text when the call fails. Not a TechEmpower test: it is for measuring where a request's work
/// runs once its handler has awaited (issue 37), against a downstream whose own cost is known (the C ceiling server's
/// /json).
/// </summary>
/// <remarks>
/// Written as an application would write it: one <see cref="HttpClient"/> for the process, so calls reuse pooled
/// keep-alive connections instead of opening one each; the request's <see cref="HttpContext.RequestAborted"/> cancels
/// the call when the client goes away; nothing waits synchronously. The awaits carry no <c>ConfigureAwait(false)</c>,
/// as handler code usually does not, so that a transport that offers a context to come back to gets the chance.
/// </remarks>
public sealed class AwaitEndpoint : IDisposable
{
    /// <summary>The endpoint's path.</summary>
    public const string Path = "/await";

    /// <summary>How long one downstream call may take, connecting included, before it answers 502.</summary>
    public static readonly TimeSpan CallTimeout = TimeSpan.FromSeconds(10);

    // A bound on what is buffered per call: the benchmark's downstream answers 27 bytes.
    private const int MaxBodyBytes = 1 << 20;

    private readonly HttpClient _client;
    private readonly Uri _downstream;

    /// <summary>Creates the endpoint and its client.</summary>
    /// <param name="downstream">The absolute URL each request calls.</param>
    public AwaitEndpoint(Uri downstream)
    {
        ArgumentNullException.ThrowIfNull(downstream);
        _downstream = downstream;
        _client = new HttpClient(new SocketsHttpHandler
        {
            // Loopback to a known server: an http_proxy in the environment must not reroute it.
            UseProxy = false,
            AllowAutoRedirect = false,
            UseCookies = false,
            ConnectTimeout = CallTimeout,
        })
        {
            Timeout = CallTimeout,
            MaxResponseContentBufferSize = MaxBodyBytes,
        };
    }

    /// <summary>Handles one request.</summary>
    /// <param name="context">The request.</param>
    /// <returns>A task that completes when the answer is written.</returns>
    public async Task Handle(HttpContext context)
    {
        ArgumentNullException.ThrowIfNull(context);
        var aborted = context.RequestAborted;
        byte[] body;
        string? contentType;
        try
        {
            // GetAsync reads the whole body before it returns, so a failure anywhere in the call comes before the
            // answer has started and can still become a 502.
            using var answer = await _client.GetAsync(_downstream, aborted);
            if (!answer.IsSuccessStatusCode)
            {
                await FailAsync(context.Response, $"downstream answered {(int)answer.StatusCode}");
                return;
            }

            body = await answer.Content.ReadAsByteArrayAsync(aborted);
            contentType = answer.Content.Headers.ContentType?.ToString();
        }
        catch (OperationCanceledException) when (aborted.IsCancellationRequested)
        {
            // The client went away; there is nobody to answer.
            return;
        }
        catch (TaskCanceledException e) when (e.InnerException is TimeoutException)
        {
            await FailAsync(context.Response, $"downstream did not answer within {CallTimeout.TotalSeconds.ToString(CultureInfo.InvariantCulture)} s");
            return;
        }
        catch (HttpRequestException e)
        {
            await FailAsync(context.Response, $"downstream call failed: {e.Message}");
            return;
        }

        var response = context.Response;
        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = contentType;
        response.ContentLength = body.Length;

        // As /json writes its body: into the response pipe, which Kestrel flushes once when the request ends, so that
        // /await and /json differ by the downstream call only.
        response.BodyWriter.Write(body);
    }

    /// <inheritdoc />
    public void Dispose() => _client.Dispose();

    private static Task FailAsync(HttpResponse response, string message)
    {
        response.StatusCode = StatusCodes.Status502BadGateway;
        response.ContentType = "text/plain";
        return response.WriteAsync(message);
    }
}
